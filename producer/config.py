"""The producer's configuration, validated up front, and the environment variables that may set it.

The environment is read only when :func:`read_env` is called (by the command line, before it parses its
flags), never at import time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ferry.common import validate as check
from ferry.common.constants import (
    DEFAULT_SLOTS, DEFAULT_THREADS, HEARTBEAT_S, LIVENESS, MAX_HEARTBEAT_S, MAX_SLOTS, MAX_THREADS, MIN_HEARTBEAT_S,
    MIN_LIVENESS,
)
from ferry.common.compression import MODES, require
from ferry.common.endpoints import expand_endpoints
from ferry.common.errors import ConfigError

__all__ = ["ProducerConfig", "expand_endpoints", "EnvVar", "PRODUCER_ENV", "read_env", "LOG_LEVELS"]

#: The --log-level choices (given in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: Warn when no consumer answered for this long, by default. [Unit: second]
UNREACHABLE_WARNING_S = 10.0


@dataclass(frozen=True)
class ProducerConfig:
    """What a producer serves, where, and how hard.

    Args:
        endpoints: consumer endpoints to connect to (port ranges allowed).
        dataset: dataset spec (see :mod:`ferry.common.datasets`); ignored when a dataset object is given to
            :func:`ferry.producer.serve`, except as the label it reports.
        dataset_args: keyword arguments of the spec.
        threads: loader threads running ``dataset[i]`` concurrently.
        slots: batches this producer takes at once from each consumer.
        heartbeat: seconds between PINGs until the consumer sets its own. [Unit: second]
        liveness: heartbeats of silence after which a consumer is considered gone.
        unreachable_warning_s: first warn when no consumer answered for this long (w), then after 3w, 6w and
            every 30w more (see producer/connection.py). [Unit: second]
        exit_with_parent: die with the parent process (local mode).
        curve: CURVE client keys, or None for plaintext.
        transform: a callable, or its ``package.module:callable`` spec, applied to every sample on the producer (disables the
            built-in datasets' read-into-batch fast path, since samples must exist as objects).
        shared_memory: ``(path, token)`` of the shared-memory slab of the consumer that started this
            producer on its own machine (see :mod:`ferry.common.shm`); None over the network.
        seed: seed of this process's ``random``, numpy and torch generators; None draws one from the OS.
        worker_id, num_workers: this producer's place among the local producers of one loader, as
            ``torch.utils.data.get_worker_info()`` reports it (0 and 1 for a producer started by hand).
        init: a callable, or a ``package.module:callable`` spec, called once in the producer process with
            ``worker_id`` after seeding, like DataLoader's ``worker_init_fn``.
        collate: the batch's collate function (a callable, or a ``package.module:callable`` spec), run on
            the producer in place of ``default_collate``, like DataLoader's ``collate_fn``. Its output may be
            any tree of dicts, lists and tuples with array, tensor and scalar leaves.
        compression: ``"auto"``, ``"lz4"``, ``"zstd"`` or ``"none"``: overrides what each consumer asks for in
            its WELCOME; None (the default) follows the consumer (see producer/compressing.py).
        stderr_path: a FIFO that :func:`ferry.producer.serve` makes this process's stderr (fd 2) before it does
            anything else but ``freeze_inherited``: set by the consumer's local mode, which reads the other end.
            None keeps the stderr the process has.
        freeze_inherited: move every object this process inherited into the garbage collector's permanent
            generation (``gc.freeze()``) as the very first thing ``serve`` does, so that no collection walks
            (and so copies) the parent's pages: set by local mode for a producer forked from the trainer.
    """

    endpoints: tuple[str, ...]
    dataset: str
    dataset_args: dict[str, Any] = field(default_factory=dict)
    threads: int = DEFAULT_THREADS
    slots: int = DEFAULT_SLOTS
    heartbeat: float = HEARTBEAT_S
    liveness: int = LIVENESS
    unreachable_warning_s: float = UNREACHABLE_WARNING_S
    exit_with_parent: bool = False
    curve: Any = None
    dataset_label: str = ""
    transform: Any = None
    metrics_port: int | None = None
    shared_memory: tuple[str, str] | None = None
    seed: int | None = None
    worker_id: int = 0
    num_workers: int = 1
    init: Any = None
    collate: Any = None
    compression: str | None = None
    stderr_path: str | None = None
    freeze_inherited: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", expand_endpoints(list(self.endpoints)))
        check.integer("threads", self.threads, low=1, high=MAX_THREADS)
        check.integer("slots", self.slots, low=1, high=MAX_SLOTS)
        check.number("heartbeat", self.heartbeat, low=MIN_HEARTBEAT_S, high=MAX_HEARTBEAT_S)
        check.integer("liveness", self.liveness, low=MIN_LIVENESS)
        check.number("unreachable_warning_s", self.unreachable_warning_s, low=0, low_open=True)
        check.optional(check.integer, "metrics_port", self.metrics_port, low=0, high=65535)
        if self.compression is not None:
            check.choice("compression", self.compression, MODES)
            require(self.compression)  # an explicit codec without its library: a ConfigError naming the package
        if not self.dataset_label:
            object.__setattr__(self, "dataset_label", self.dataset)


# --- the environment ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, how its text becomes a value, and what a good one looks like."""

    name: str
    parse: Callable[[str], Any]
    expected: str

    def read(self, environ: Mapping[str, str]) -> Any:
        """The parsed value, or None when unset or empty. Raises ConfigError naming the variable."""
        text = environ.get(self.name, "")
        if not text.strip():
            return None
        try:
            return self.parse(text.strip())
        except (ValueError, TypeError):
            raise ConfigError(f"environment variable {self.name}={text!r} is not {self.expected}") from None


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(text)
    return text.upper()


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def _token_path(text: str) -> tuple[str, str]:
    token, _, path = text.partition(":")
    if not (token and path):
        raise ValueError(text)
    return path, token


def _compression(text: str) -> str:
    if text.lower() not in MODES:
        raise ValueError(text)
    return text.lower()


def _worker(text: str) -> tuple[int, int]:
    """``ID/COUNT``: a local producer's place among its loader's producers (set by the loader)."""
    worker_id, _, count = text.partition("/")
    if not (worker_id.isdigit() and count.isdigit() and int(worker_id) < int(count)):
        raise ValueError(text)
    return int(worker_id), int(count)


#: Every environment variable of the producer's command line, by the flag (or setting) it stands for.
PRODUCER_ENV: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("FERRY_CONNECT", lambda t: [e.strip() for e in t.split(",") if e.strip()], "comma-separated endpoints"),
    EnvVar("FERRY_DATASET", str, "a dataset spec"),
    EnvVar("FERRY_DATASET_ARGS", _json_object, "a JSON object"),
    EnvVar("FERRY_TRANSFORM", str, "package.module:callable"),
    EnvVar("FERRY_THREADS", int, "an integer"),
    EnvVar("FERRY_SLOTS", int, "an integer"),
    EnvVar("FERRY_CURVE_KEY", str, "a file name"),
    EnvVar("FERRY_CURVE_SERVER_KEY", str, "a file name"),
    EnvVar("FERRY_METRICS_PORT", int, "a port number"),
    EnvVar("FERRY_LOG_LEVEL", _log_level, f"one of {', '.join(LOG_LEVELS)} (any case)"),
    EnvVar("FERRY_EXIT_WITH_PARENT", _flag, "0 or 1"),
    EnvVar("FERRY_SHARED_MEMORY", _token_path, "TOKEN:PATH"),
    EnvVar("FERRY_UNREACHABLE_WARNING_S", float, "a number of seconds"),
    EnvVar("FERRY_INIT", str, "package.module:callable"),
    EnvVar("FERRY_COLLATE", str, "package.module:callable"),
    EnvVar("FERRY_WORKER", _worker, "ID/COUNT"),
    EnvVar("FERRY_COMPRESSION", _compression, f"one of {', '.join(MODES)}"),
)}


def read_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every ``PRODUCER_ENV`` variable that is set, parsed: ``{"FERRY_THREADS": 8, ...}``.

    Raises:
        ConfigError: a variable that does not parse; the message names it, its value and what it should be.
    """
    environ = os.environ if environ is None else environ
    values = {name: var.read(environ) for name, var in PRODUCER_ENV.items()}
    return {name: value for name, value in values.items() if value is not None}
