"""The producer's configuration, each option declared once, and the environment variables that may set it.

Every field of :class:`ProducerConfig` is declared by a :class:`~ferry.common.settings.Setting`: its check, its
default, its doc and, for most, its command-line flag and ``FERRY_*`` variable. The options a loader's local
producers take from the loader (threads, slots, heartbeat, liveness, the hooks) are the very declarations of the
consumer's option groups (:mod:`ferry.common.settings`). :data:`COMMAND_LINE` lists what the command line sets
(:mod:`ferry.producer.cli` builds its flags from it, and writes a config back as a command line for local mode).

The environment is read only when :func:`read_env` is called (by the command line, before it parses its
flags), never at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ferry.common import settings as s
from ferry.common.constants import (
    DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_EXIT_WHEN_STUCK_S, DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL,
    DEFAULT_RESOLVE_INTERVAL_S, DEFAULT_STUCK_AFTER_S, DEFAULT_THREADS, DEFAULT_UNREACHABLE_WARNING_S, LOG_FORMATS,
    LOG_LEVELS,
)
from ferry.common.endpoints import expand_endpoints
from ferry.common.errors import ConfigError
from ferry.common.settings import Setting, option

__all__ = ["ProducerConfig", "expand_endpoints", "COMMAND_LINE", "PRODUCER_ENV", "read_env", "LOG_LEVELS"]


# --- the kinds only a producer takes -----------------------------------------------------------------
class _CommaList(s.Kind):
    """A repeated flag, or a comma-separated variable; the flags replace the variable."""

    repeated = True

    def parse(self, text: str) -> list[str]:
        return [e.strip() for e in text.split(",") if e.strip()]

    def combine(self, variable: Any, flags: list[str]) -> list[str] | None:
        """The flags replace the variable."""
        return flags or variable

    def items(self, value: Any) -> list[str]:
        return list(value)


class _Endpoints(_CommaList):
    """Consumer endpoints: one a ``--connect`` (repeated), or a comma-separated variable."""

    expected = "comma-separated endpoints"

    def check(self, name: str, value: Any) -> tuple[str, ...]:
        return expand_endpoints(list(value))


class _AllowedSpecs(_CommaList):
    """Dataset specs a consumer may name (``package.module:callable``): one a ``--allow-dataset`` (repeated), or a
    comma-separated variable."""

    expected = "comma-separated package.module:callable specs"

    def check(self, name: str, value: Any) -> tuple[str, ...]:
        specs = tuple(value)
        for spec in specs:
            module, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
            if not (sep and module and attr):
                raise ConfigError(f"{name}: {spec!r} is not a package.module:callable dataset spec (built-in datasets "
                                  "are always allowed)")
        return specs


class _TokenPath(s.Kind):
    """A shared-memory slab: ``(path, token)``, written ``TOKEN:PATH``."""

    expected = "TOKEN:PATH"

    def check(self, name: str, value: Any) -> tuple[str, str]:
        if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{name} must be a (path, token) pair of strings, got {value!r}")
        return tuple(value)

    def parse(self, text: str) -> tuple[str, str]:
        token, _, path = text.partition(":")
        if not (token and path):
            raise ValueError(text)
        return path, token

    def format(self, value: Any) -> str:
        return f"{value[1]}:{value[0]}"


class _Worker(s.Kind):
    """``ID/COUNT``: a local producer's place among its loader's producers (set by the loader)."""

    expected = "ID/COUNT"

    def parse(self, text: str) -> tuple[int, int]:
        worker_id, _, count = text.partition("/")
        if not (worker_id.isdigit() and count.isdigit() and int(worker_id) < int(count)):
            raise ValueError(text)
        return int(worker_id), int(count)

    def format(self, value: Any) -> str:
        return f"{value[0]}/{value[1]}"


# --- ProducerConfig -----------------------------------------------------------------------------------
@s.documented
@dataclass(frozen=True)
class ProducerConfig:
    """What a producer serves, where, and how hard; checked when built (a ConfigError names the field).

    The command line builds one from its flags and variables; local mode builds one from the loader's options;
    :func:`ferry.producer.serve` takes one built by hand.
    """

    endpoints: tuple[str, ...] = option(Setting(
        _Endpoints(), "consumer endpoints, tcp://HOST:PORT, tcp://HOST:PORT-PORT (a range of ranks) or ipc://PATH; "
        "repeat the flag for several consumers; a host name reaches every address it resolves to (see "
        "--resolve-interval).", flag="--connect", metavar="ENDPOINT"))
    dataset: str = option(Setting(
        s.Text("a dataset spec", nonempty=False), "a built-in dataset (synthetic, npy-folder, image-folder, packed, tar-shards) or "
        "package.module:callable that returns a dataset; only a label when serve() is given a dataset object. Served to "
        "every consumer that names no dataset of its own; without it, the producer serves only the datasets consumers "
        "name (RemoteLoader(dataset='SPEC'): a pool, docs/deployment.md#one-pool-several-jobs).", "",
        flag="--dataset", metavar="SPEC"))
    allow_dataset: tuple[str, ...] = option(Setting(
        _AllowedSpecs(), "a package.module:callable dataset spec that a consumer may name for this producer to open "
        "(with the consumer's dataset_args); repeatable. The built-in datasets are always allowed; any other spec a "
        "consumer names is refused, naming this list.", (), flag="--allow-dataset", metavar="SPEC"))
    dataset_args: dict[str, Any] = option(Setting(
        s.KeywordArgs("dataset argument"), "keyword arguments of the dataset spec: KEY=VALUE, VALUE parsed as JSON when it parses, "
        "else taken as a string; repeatable (the variable: a JSON object).", {}, flag="--dataset-arg",
        env="FERRY_DATASET_ARGS", metavar="KEY=VALUE"))
    threads: int | None = option(s.THREADS)
    seed_per_sample: bool | None = option(s.SEED_PER_SAMPLE)
    slots: int = option(s.SLOTS)
    heartbeat: float = option(s.HEARTBEAT)
    liveness: int = option(s.LIVENESS)
    unreachable_warning_s: float = option(Setting(
        s.Real(0, low_open=True, expected="a number of seconds"), "first warn when no consumer answered for this "
        "long (w), then after 3w, 6w and every 30w more (see producer/core/connection.py); the same for loads given up "
        "on by their consumer that hold every loading thread (producer/core/stuck.py).",
        DEFAULT_UNREACHABLE_WARNING_S, unit="second", env="FERRY_UNREACHABLE_WARNING_S"))
    resolve_interval: float = option(Setting(
        s.Real(0, 86400, expected="a number of seconds"), "resolve each endpoint's host name again this often and "
        "connect to every IPv4 address it has, one consumer each (a Kubernetes headless Service, a Swarm dnsrr "
        "service): addresses that appear are joined, those that go are left, without a restart; 0: never (ZeroMQ "
        "resolves each name itself, to one address).", DEFAULT_RESOLVE_INTERVAL_S, unit="second",
        flag="--resolve-interval", metavar="SECONDS"))
    status_file: str | None = option(Setting(
        s.Path(), "keep this producer's status in this file (JSON, replaced every second, removed at exit) for "
        "--probe: an engine's exec probe runs python -m ferry.producer --probe live (or ready) with the same "
        "variable; none by default.", None, optional=True, flag="--status-file", metavar="PATH"))
    stuck_after: float = option(Setting(
        s.Real(0.1, 3600, expected="a number of seconds"), "--probe live fails once the main loop has not turned "
        "for this long (it is stuck, even if its loading threads still run).", DEFAULT_STUCK_AFTER_S, unit="second",
        flag="--stuck-after", metavar="SECONDS"))
    exit_when_stuck: float = option(Setting(
        s.Real(0, 86400, expected="a number of seconds"), "exit with status 5 once loads its "
        "consumers gave up on (a __getitem__ that hangs) have held all its loading threads or slots for this long "
        "and it serves no other consumer, so that its supervisor starts a fresh process (local mode: the loader's task_timeout); 0: keep waiting "
        "for them (producer/core/stuck.py).", DEFAULT_EXIT_WHEN_STUCK_S, unit="second", flag="--exit-when-stuck",
        metavar="SECONDS"))
    drain_timeout: float = option(Setting(
        s.Real(0, 3600, expected="a number of seconds"), "on SIGTERM, after saying BYE (its consumers re-issue "
        "what it held), wait this long at most for the samples being loaded, then exit without them.",
        DEFAULT_DRAIN_TIMEOUT_S, unit="second", flag="--drain-timeout", metavar="SECONDS"))
    exit_with_parent: bool = option(Setting(s.Bool(), "die with the parent process (local mode).", False,
                                            env="FERRY_EXIT_WITH_PARENT"))
    trainer_pid: int | None = option(Setting(
        s.Int(1), "the training process (local mode, with exit_with_parent): when another process started this one "
        "(a forkserver), it is watched too, so that the producer never outlives it.", None, optional=True,
        env="FERRY_TRAINER_PID"))
    curve: Any = option(Setting(s.Kind(), "CURVE client keys (a CurveClient), or None for plaintext; the command "
                                "line loads them from --curve-key and --curve-server-key.", None, optional=True))
    dataset_label: str = option(Setting(s.Kind(), "what the producer says it serves; by default ``dataset``.", ""))
    transform: Any = option(s.TRANSFORM)
    transform_args: dict[str, Any] = option(s.TRANSFORM_ARGS)
    metrics_port: int | None = option(s.METRICS_PORT)
    shared_memory: tuple[str, str] | None = option(Setting(
        _TokenPath(), "the shared-memory slab of the loader that started this producer on its machine (see "
        "ferry.common.shm): (path, token), TOKEN:PATH in the variable; None over the network.", None, optional=True,
        env="FERRY_SHARED_MEMORY"))
    seed: int | None = option(Setting(
        s.Int(), "seed of this process's random, numpy and torch generators; by default (None) one is drawn from "
        "the OS, so that no two producers share a stream. For reproducible augmentation use ferry.sample_info().seed in the "
        "dataset instead.", None, optional=True, flag="--seed"))
    worker_id: int = option(Setting(s.Int(0), "this producer's place among the local producers of one loader, as "
                                    "torch.utils.data.get_worker_info() reports it.", 0))
    num_workers: int = option(Setting(s.Int(1), "how many local producers that loader runs (under "
                                      "local_producers=\"auto\", the most it may run).", 1))
    init: Any = option(s.INIT)
    collate: Any = option(s.COLLATE)
    collate_args: dict[str, Any] = option(s.COLLATE_ARGS)
    compression: str | None = option(Setting(
        s.Compression(), "compress batch frames: lz4, zstd or none overrides the codec each consumer's tasks ask "
        "for (RemoteLoader's compression=, by default auto: the consumer decides); auto, like the default (None), "
        "follows the consumer; lz4 needs ferry[lz4], zstd ferry[zstd] (see producer/loading/compressing.py).",
        None, optional=True, flag="--compression"))
    stderr_path: str | None = option(Setting(
        s.Path(), "a FIFO that ferry.producer.serve makes this process's stderr (fd 2) before it does anything else "
        "but freeze_inherited: set by the consumer's local mode, which reads the other end. None keeps the stderr "
        "the process has.", None, optional=True))
    freeze_inherited: bool = option(Setting(
        s.Bool(), "move every object this process inherited into the garbage collector's permanent generation "
        "(gc.freeze()) as the very first thing serve does, so that no collection walks (and so copies) the "
        "parent's pages: set by local mode for a producer forked from the trainer.", False))
    ahead: int | None = option(s.AHEAD)
    torch_threads: int | None = option(Setting(
        s.Int(1, 1024), "CPU threads of each torch operation in this producer (torch.set_num_threads), which loads "
        "--threads samples at once: by default 1, as DataLoader sets in each worker, unless OMP_NUM_THREADS or "
        "MKL_NUM_THREADS is set in its environment (torch then follows it); more only for a few heavy samples at a "
        "time. Where torch is not loaded yet, set through those variables, which the process keeps "
        "(producer/torch_threads.py). Local producers: 1.", None, optional=True, flag="--torch-threads",
        metavar="N"))

    @property
    def pool_threads(self) -> int:
        """The sample pool's threads (``threads``; None: DEFAULT_THREADS). Whether a dataset's loads may use more
        than one at a time: :func:`ferry.producer.loading.samples.loads_concurrently`."""
        return DEFAULT_THREADS if self.threads is None else self.threads

    @property
    def tasks_ahead(self) -> int:
        """The tasks it takes from each consumer beyond its slots (``ahead``; None: as many as the slots)."""
        return self.slots if self.ahead is None else self.ahead

    def __post_init__(self) -> None:
        s.check_fields(self)
        for hook in ("collate", "transform"):
            if getattr(self, f"{hook}_args") and getattr(self, hook) is None:
                raise ConfigError(f"{hook}_args without a {hook}: give --{hook} package.module:callable too")
        if self.worker_id >= self.num_workers:
            raise ConfigError(f"worker_id {self.worker_id} is not in range for num_workers {self.num_workers}")
        if not self.dataset_label:
            object.__setattr__(self, "dataset_label", self.dataset)


# --- the command line and the environment -------------------------------------------------------------
LOG_LEVEL = Setting(s.Choice(LOG_LEVELS, fold=str.upper), "log verbosity, in any case.", DEFAULT_LOG_LEVEL,
                    flag="--log-level")
LOG_FORMAT = Setting(s.Choice(LOG_FORMATS, fold=str.lower), "plain: a line of text per event; json: one JSON object "
                     "per line (time, level, logger, message, pid and the event's fields), for an engine's log "
                     "collector.", DEFAULT_LOG_FORMAT, flag="--log-format")
CURVE_KEY = Setting(s.Path(), "this producer's CURVE key pair (a .key_secret file from ferry keys); enables "
                    "encryption and authentication.", None, optional=True, flag="--curve-key", metavar="FILE")
CURVE_SERVER_KEY = Setting(s.Path(), "the consumer's CURVE public key (server.key).", None, optional=True,
                           flag="--curve-server-key", metavar="FILE")
WORKER = Setting(_Worker(), "this producer's worker_id/num_workers (set by a loader's local mode; by hand, it makes a "
                 "producer of an IterableDataset read stream worker_id of num_workers only: docs/datasets.md).",
                 (0, 1), env="FERRY_WORKER")

#: What the command line sets, by where the value goes: a ProducerConfig field with a flag or a variable, or
#: one of the command line's own (the log level and format, the CURVE key files, the worker id and count).
COMMAND_LINE: dict[str, Setting] = {
    **{f.name: s.setting_of(f) for f in fields(ProducerConfig) if s.setting_of(f).variable},
    "curve_key": CURVE_KEY, "curve_server_key": CURVE_SERVER_KEY, "worker": WORKER, "log_level": LOG_LEVEL,
    "log_format": LOG_FORMAT,
}
#: Every ``FERRY_*`` variable of the producer, with its setting.
PRODUCER_ENV: dict[str, Setting] = {setting.variable: setting for setting in COMMAND_LINE.values()}


def read_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every ``PRODUCER_ENV`` variable that is set, parsed: ``{"FERRY_THREADS": 8, ...}``.

    Raises:
        ConfigError: a variable that does not parse; the message names it, its value and what it should be.
    """
    environ = os.environ if environ is None else environ
    values = {name: setting.read(environ) for name, setting in PRODUCER_ENV.items()}
    return {name: value for name, value in values.items() if value is not None}
