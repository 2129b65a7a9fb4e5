"""Command line of the producer: ``python -m ferry.producer`` and ``ferry produce``.

Its flags and ``FERRY_*`` variables are not written here: each is the declaration of an option in
:mod:`ferry.producer.config` (:data:`~ferry.producer.config.COMMAND_LINE`), with its type, default, help and
variable. :func:`build_parser` makes the flags from them, :func:`config_from_command_line` the
:class:`ProducerConfig`, and :func:`command_line` goes the other way: the flags and variables that make a
producer build a given config, which is how a loader's local mode starts a producer by spec.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from typing import Any, Mapping

from ferry.common.constants import DEFAULT_LOG_LEVEL
from ferry.common.errors import ConfigError
from ferry.common.settings import REQUIRED
from ferry.common.variables import KEEP_FREED_MEMORY, warn_unknown_variables

from ferry.producer.config import COMMAND_LINE, PRODUCER_ENV, WORKER, ProducerConfig, read_env
from ferry.producer.exits import (
    EXIT_CONFIG, EXIT_CRASH, EXIT_DATASET, describe_statuses, exit_past_lingering_threads, failure_status,
)
from ferry.producer.logs import configure as configure_logging, fields
from ferry.producer.status import PROBES

__all__ = ["build_parser", "command_line_values", "config_from_command_line", "command_line", "main"]

PROG = "python -m ferry.producer"
_FIELDS = set(ProducerConfig.__dataclass_fields__)

EXAMPLES = """\
examples:
  # serve .npy files in class folders to a trainer on another host
  python -m ferry.producer --connect tcp://trainer:5555 --dataset npy-folder --dataset-arg root=/data/train

  # serve all 4 ranks of a torchrun job on one host (ports 5555..5558), 8 loader threads
  python -m ferry.producer --connect tcp://trainer:5555-5558 --dataset npy-folder --dataset-arg root=/data --threads 8

  # your own dataset: a class or factory, with keyword arguments (JSON values); it loads one sample at a
  # time, as in a DataLoader worker, unless --threads says its __getitem__ is thread-safe
  python -m ferry.producer --connect tcp://127.0.0.1:5555 --dataset mypkg.data:TileDataset \\
      --dataset-arg root=/data --dataset-arg 'bands=[1,2,3]' --threads 4

  # a synthetic dataset with 5 ms of latency per sample
  python -m ferry.producer --connect tcp://127.0.0.1:5555 --dataset synthetic \\
      --dataset-arg length=10000 --dataset-arg 'shape=[13,299,299]' --dataset-arg delay=0.005

  # CURVE: encrypted, and only producers whose keys the consumer authorized get work
  python -m ferry.producer --connect tcp://trainer:5555 --dataset synthetic \\
      --curve-key keys/producer.key_secret --curve-server-key keys/server.key

  # under an engine: every trainer behind a DNS name (a Kubernetes headless Service, a Swarm dnsrr service),
  # followed as it changes; one JSON object per log line; a status file for the engine's exec probes
  FERRY_STATUS_FILE=/tmp/ferry-status.json python -m ferry.producer --connect tcp://trainers:5555 \\
      --dataset npy-folder --dataset-arg root=/data --log-format json
  FERRY_STATUS_FILE=/tmp/ferry-status.json python -m ferry.producer --probe live     # exit 0: live, 1: not

Every flag can also come from the environment, as its help says: FERRY_ and the flag's name (FERRY_CONNECT
comma-separated, FERRY_DATASET_ARGS a JSON object). A flag wins over its variable; a variable that does not
parse is an error (exit status 2), even with --help. A FERRY_* variable that no part of Ferry reads (a typo:
FERRY_THREAD for FERRY_THREADS) is named in a WARNING at start, with the closest known one, and ignored.

"""



def _builtins() -> str:
    """The epilog's list of the built-in datasets, from their declarations (ferry.common.datasets)."""
    from ferry.common.datasets import describe_builtins

    return ("\nBuilt-in datasets (--dataset NAME, then --dataset-arg KEY=VALUE for each argument; those without a "
            "default are required):\n" + describe_builtins() + "\n")


def _environment_only() -> str:
    """The epilog's list of the variables that have no flag."""
    lines = ["", "Variables without a flag (a loader's local mode sets the last three):"]
    for setting in COMMAND_LINE.values():
        if not setting.flag:
            text = f"{setting.variable}: {setting.help(variable=False).replace('%%', '%')}"
            lines += textwrap.wrap(text, 110, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines) + "\n"


def build_parser(prog: str = PROG, env: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The producer's flags; their defaults come from ``env``, the parsed variables of :func:`read_env`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Ferry producer: read samples of a dataset, collate them into batches, and stream them to "
            "Ferry consumers (RemoteLoader) over ZeroMQ. Consumers decide which samples form each batch; "
            "start as many producers as you like, on any host, in any order."
        ),
        epilog=EXAMPLES + describe_statuses() + _builtins() + _environment_only(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env = env or {}
    # a mode of the command, not an option of the producer: no variable (FERRY_PROBE in a container's environment
    # would turn the producer itself into a probe)
    parser.add_argument("--probe", choices=PROBES, default=None,
                        help="answer an engine's probe instead of serving: read the status file of the producer "
                             "running with the same --status-file (or FERRY_STATUS_FILE), print one line, and exit 0 "
                             "(yes) or 1 (no). live: its main loop turned within --stuck-after seconds (or it is "
                             "still starting); ready: live and serving its dataset (not starting or stopping); "
                             "serving: ready, and at least one consumer is being served")
    for dest, setting in COMMAND_LINE.items():
        if not setting.flag:
            continue
        common = {"dest": dest, "metavar": setting.metavar or None, "help": setting.help()}
        if setting.kind.repeated:  # combined with its variable afterwards (command_line_values)
            parser.add_argument(setting.flag, action="append", default=[], **common)
        else:
            default = env.get(setting.variable, None if setting.default is REQUIRED else setting.default)
            parser.add_argument(setting.flag, default=default, **common, **setting.kind.argparse())
    return parser


def command_line_values(args: Mapping[str, Any], env: Mapping[str, Any]) -> dict[str, Any]:
    """What the parsed flags (``args``) and variables (``env``, from :func:`read_env`) set, by
    :data:`COMMAND_LINE` name; None where neither sets it. A flag wins over its variable.

    Raises:
        DatasetSpecError: a ``--dataset-arg`` that is not KEY=VALUE.
    """
    values = {}
    for dest, setting in COMMAND_LINE.items():
        variable = env.get(setting.variable)
        if not setting.flag:
            values[dest] = variable
        elif setting.kind.repeated:
            values[dest] = setting.kind.combine(variable, args[dest])
        else:
            values[dest] = args[dest]
    return values


def config_from_command_line(values: Mapping[str, Any]) -> ProducerConfig:
    """The :class:`ProducerConfig` of :func:`command_line_values`; CURVE keys are loaded from their files.

    Raises:
        ConfigError: a value out of range, one CURVE key file without the other, or an unreadable key file.
    """
    given = {name: value for name, value in values.items() if name in _FIELDS and value is not None}
    key, server_key = values.get("curve_key"), values.get("curve_server_key")
    if key or server_key:
        from ferry.common.security import CurveClient

        if not (key and server_key):
            raise ConfigError("CURVE needs both --curve-key and --curve-server-key")
        given["curve"] = CurveClient.load(key, server_key)
    given["worker_id"], given["num_workers"] = values.get("worker") or WORKER.default
    return ProducerConfig(**given)


def command_line(config: ProducerConfig, log_level: str = DEFAULT_LOG_LEVEL,
                 environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The flags and ``FERRY_*`` variables with which ``python -m ferry.producer`` builds ``config``: what a
    loader's local mode passes to a producer it starts by spec. Only what differs from the default is written,
    as its flag where the option has one, else as its variable.

    Args:
        environ: an environment to pass on with the variables (a child's inherited one), less every variable
            of the producer's (:data:`PRODUCER_ENV`), so that only ``config`` configures the producer.

    Raises:
        ConfigError: ``config`` holds what no command line can say (a callable hook, CURVE keys in memory).
    """
    if config.curve is not None:
        raise ConfigError("CURVE keys in memory have no command line: start such a producer with --curve-key and "
                          "--curve-server-key")
    values = {name: getattr(config, name) for name in COMMAND_LINE if name in _FIELDS}
    values.update(worker=(config.worker_id, config.num_workers), log_level=log_level)
    argv: list[str] = []
    env = {name: text for name, text in (environ or {}).items() if name not in PRODUCER_ENV}
    for dest, setting in COMMAND_LINE.items():
        value = values.get(dest)
        if value is None or value == setting.default:
            continue
        if not setting.flag:
            env[setting.variable] = setting.kind.format(value)
            continue
        for text in setting.kind.items(value) if setting.kind.repeated else [setting.kind.format(value)]:
            argv += [f"{setting.flag}={text}"] if text.startswith("-") else [setting.flag, text]
    return argv, env


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """The producer's command line: serve until SIGTERM/SIGINT, or answer a probe. Returns the exit status
    (:mod:`ferry.producer.exits`)."""
    from ferry.producer import serve

    try:
        env = read_env()  # before the flags, so that a bad variable is named even with --help
    except ConfigError as exc:
        print(f"ferry producer: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    parser = build_parser(prog, env)
    args = vars(parser.parse_args(argv))
    if args["probe"]:
        return _probe(args["probe"], args["status_file"])
    configure_logging(args["log_level"], args["log_format"])
    if not env.get(COMMAND_LINE["exit_with_parent"].variable):  # else a loader's: it checked the same environment
        warn_unknown_variables(logging.getLogger("ferry.producer"), "producer", {*PRODUCER_ENV, KEEP_FREED_MEMORY})
    for dest, setting in COMMAND_LINE.items():
        if setting.default is REQUIRED and not (args[dest] or env.get(setting.variable)):
            parser.error(f"{setting.flag} is required (or set {setting.variable})")
    try:
        code = serve(config_from_command_line(command_line_values(args, env)))
    except Exception as exc:
        code = failure_status(exc)
        _report_failure(exc, code, json_lines=args["log_format"] == "json")
    return exit_past_lingering_threads(code)


def _probe(kind: str, status_file: str | None) -> int:
    from ferry.producer.status import probe_file

    try:
        ok, line = probe_file(kind, status_file)
    except ConfigError as exc:
        print(f"ferry producer: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(line)
    return 0 if ok else 1


def _report_failure(exc: Exception, code: int, json_lines: bool) -> None:
    """One line for a failure the producer expects (configuration, the dataset), a traceback for a bug."""
    log = logging.getLogger("ferry.producer")
    failure = {EXIT_CONFIG: "configuration", EXIT_DATASET: "dataset"}.get(code, "crash")
    extra = fields(event="exit", exit_code=code, failure=failure)
    if code == EXIT_CRASH:
        log.critical("unexpected error, exiting %d: %s: %s", code, type(exc).__name__, exc, exc_info=exc, extra=extra)
    elif json_lines:
        log.error("%s", exc, extra=extra)
    else:
        print(f"ferry producer: error: {exc}", file=sys.stderr)
