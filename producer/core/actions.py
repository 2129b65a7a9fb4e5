"""What a producer's connection state machine (:mod:`ferry.producer.core.connection`) asks of its poll loop: the
actions returned by each event, applied by :mod:`ferry.producer.io.service`; and the phases of a connection."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

__all__ = ["Phase", "SendHello", "SendPing", "SendBye", "RunTask", "FailTask", "CheckAddress", "Stale", "Rebuild",
           "OpenDataset", "Log", "Action"]


class Phase(enum.Enum):
    GREETING = "greeting"
    SERVING = "serving"
    CLOSED = "closed"


# --- actions: what the poll loop must do ---------------------------------------------------------------
@dataclass(frozen=True)
class SendHello:
    """Say HELLO with this nonce; report the result with :meth:`Connection.sent` or ``hello_unsent``."""

    nonce: int


@dataclass(frozen=True)
class SendPing:
    """Send a PING; ``pending`` is this session's unanswered tasks (the loop adds its own figures)."""

    pending: int


@dataclass(frozen=True)
class SendBye:
    """Say BYE (the producer stops)."""


@dataclass(frozen=True)
class AnswerBye:
    """Answer a consumer's BYE with ours, at once (a hold keeps only HELLOs back): the closing consumer keeps the
    connection until it hears from us, since our socket drops what we have not read the moment it goes."""


@dataclass(frozen=True)
class RunTask:
    """Start the TASK in ``header`` (the loop maps its slot, submits it, then calls ``task_started``)."""

    header: dict


@dataclass(frozen=True)
class FailTask:
    """Answer the TASK in ``header`` with a FAIL at once, without running it: ``index`` is outside the
    dataset (the consumer's plan is wrong; dropping the TASK would only have it re-issued)."""

    header: dict
    index: int
    message: str


@dataclass(frozen=True)
class CheckAddress:
    """Resolve this endpoint's host off the main loop; report with :meth:`Connection.address_checked`."""


@dataclass(frozen=True)
class Stale:
    """A message of a session this connection has left (sent before the consumer saw our new HELLO); count it."""


@dataclass(frozen=True)
class Rebuild:
    """Close this endpoint's socket and connect a fresh one."""


@dataclass(frozen=True)
class OpenDataset:
    """A consumer named the dataset it wants (a pool: common/pool.py): open it (or find it open), bind this
    connection to it, and report with :meth:`Connection.dataset_bound` (its HELLO then announces it)."""

    spec: str
    args: dict


@dataclass(frozen=True)
class Log:
    """Log ``message`` at ``level``; ``fields``: the event's fields for a JSON log line (producer/logs.py), not
    compared (a test compares what is said)."""

    level: int
    message: str
    fields: dict = field(default_factory=dict, compare=False, hash=False)


Action = Union[SendHello, SendPing, SendBye, AnswerBye, RunTask, FailTask, CheckAddress, Stale, Rebuild, OpenDataset,
               Log]
