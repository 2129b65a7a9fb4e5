"""The producer's configuration, validated up front."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ferry.common.constants import DEFAULT_SLOTS, DEFAULT_THREADS, HEARTBEAT_S, LIVENESS, MAX_SLOTS
from ferry.common.endpoints import expand_endpoints
from ferry.common.errors import ConfigError

__all__ = ["ProducerConfig", "expand_endpoints"]


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
        unreachable_warning_s: warn once when no consumer answered for this long. [Unit: second]
        exit_with_parent: die with the parent process (local mode).
        curve: CURVE client keys, or None for plaintext.
        transform: ``package.module:callable`` applied to every sample on the producer (disables the
            built-in datasets' read-into-batch fast path, since samples must exist as objects).
        shared_memory: ``(path, token)`` of the shared-memory slab of the consumer that started this
            producer on its own machine (see :mod:`ferry.common.shm`); None over the network.
    """

    endpoints: tuple[str, ...]
    dataset: str
    dataset_args: dict[str, Any] = field(default_factory=dict)
    threads: int = DEFAULT_THREADS
    slots: int = DEFAULT_SLOTS
    heartbeat: float = HEARTBEAT_S
    liveness: int = LIVENESS
    unreachable_warning_s: float = float(os.environ.get("FERRY_UNREACHABLE_WARNING_S", "10"))
    exit_with_parent: bool = False
    curve: Any = None
    dataset_label: str = ""
    transform: str | None = None
    metrics_port: int | None = None
    shared_memory: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", expand_endpoints(list(self.endpoints)))
        if not 1 <= self.threads <= 1024:
            raise ConfigError(f"threads must be in 1..1024, got {self.threads}")
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ConfigError(f"slots must be in 1..{MAX_SLOTS}, got {self.slots}")
        if not 0.01 <= self.heartbeat <= 60:
            raise ConfigError(f"heartbeat must be in 0.01..60 s, got {self.heartbeat}")
        if self.liveness < 2:
            raise ConfigError(f"liveness must be >= 2 heartbeats, got {self.liveness}")
        if not self.dataset_label:
            object.__setattr__(self, "dataset_label", self.dataset)
