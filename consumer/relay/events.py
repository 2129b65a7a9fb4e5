"""What the relay's core takes and gives (``core.py``): the items of a pass, the loader thread's commands and answers,
and the actions the socket loop applies. Plain values, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.common.constants import RELAY_PROTOCOL_VERSION

__all__ = ["Item", "ErrorReport", "StartPass", "PullItem", "SetEpoch", "LoadState", "PassStarted", "Pulled", "Done",
           "Send", "SendItem", "SendStats", "Close", "RunLoader", "Stop", "Log", "refusal"]


@dataclass(frozen=True)
class ErrorReport:
    """An exception, as it crosses to the client: its class name, the names of its classes (most derived first),
    its message and traceback; ``consumed``: it took a batch's position (the next item is the next batch)."""

    cls: str
    classes: tuple[str, ...]
    message: str
    traceback: str
    consumed: bool = False


@dataclass
class Item:
    """One item of a pass: ``kind`` ``batch`` (its ``tree``), ``error`` (its ``error``) or ``end``; ``number``: its
    place in the pass, from 0; ``index``: the batch's position in its epoch (-1 when none); ``state``: the loader's
    state once the client has consumed it; ``slot``: the payload slot a batch's arrays are written to."""

    pass_no: int
    number: int
    kind: str
    epoch: int
    index: int
    state: dict[str, Any]
    tree: Any = None
    error: ErrorReport | None = None
    slot: int = -1


# --- the loader thread's commands and answers ---
@dataclass(frozen=True)
class StartPass:
    pass_no: int


@dataclass(frozen=True)
class PullItem:
    pass_no: int
    number: int


@dataclass(frozen=True)
class SetEpoch:
    epoch: int


@dataclass(frozen=True)
class LoadState:
    state: dict[str, Any]


@dataclass(frozen=True)
class PassStarted:
    """``iter`` ran: the pass's epoch, its first batch's position, its batches (-1: not known in advance)."""

    pass_no: int
    epoch: int
    first: int
    length: int
    state: dict[str, Any]
    error: ErrorReport | None = None


@dataclass(frozen=True)
class Pulled:
    item: Item


@dataclass(frozen=True)
class Done:
    """``set_epoch`` or ``load_state`` ran (``error`` if it raised); ``state``: the loader's state after it."""

    command: str
    state: dict[str, Any] | None
    error: ErrorReport | None = None


# --- actions ---
@dataclass(frozen=True)
class Send:
    conn: Any
    type: str
    fields: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SendItem:
    """Send an item to a client that reads arrays in ``order`` and ``dtypes``, their bytes ``inline`` or in a
    payload ``file``."""

    conn: Any
    item: Item
    order: str
    dtypes: frozenset[str]
    payload: str


@dataclass(frozen=True)
class SendStats:
    """Answer ``stats``: the relay's figures and its loader's ``stats()``."""

    conn: Any
    figures: dict[str, Any]


@dataclass(frozen=True)
class Close:
    conn: Any


@dataclass(frozen=True)
class RunLoader:
    command: Any


@dataclass(frozen=True)
class Stop:
    reason: str


@dataclass(frozen=True)
class Log:
    level: str
    text: str


def refusal(conn: Any, reason: str) -> list[Any]:
    """Refuse a connection: a ``refuse`` message with the reason, then close it."""
    return [Send(conn, "refuse", {"version": RELAY_PROTOCOL_VERSION}, {"reason": reason}), Close(conn)]
