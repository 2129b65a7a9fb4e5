"""What the consumer core asks of the io thread: the actions returned by each event of
:class:`~ferry.consumer.core.consumer.ConsumerCore`. The io thread applies them in order, after releasing
its lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ferry.consumer.core.delivery import Delivery, EndOfRun

__all__ = ["Send", "Deliver", "Log", "Action"]


@dataclass(frozen=True)
class Send:
    """Send ``frames`` to ``peer``. For a TASK, ``tasks`` are the ids of the tasks it carries: a send that fails is
    reported back with :meth:`~ferry.consumer.core.consumer.ConsumerCore.unsent`."""

    peer: bytes
    frames: list[bytes]
    tasks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Deliver:
    """Hand ``item`` on towards the training loop (items come in the order the loop must see them)."""

    item: Delivery | EndOfRun


@dataclass(frozen=True)
class Log:
    """Log ``message`` at ``level`` (logger ``ferry.consumer``)."""

    level: int
    message: str


Action = Union[Send, Deliver, Log]
