"""What goes out when credits allow: a TASK for each new task, or its batch's error in its place at once.

:func:`issue` turns the dispatcher's assignments into TASK messages: the sample indices from the run's
sequencer (checked against the dataset's length: an index outside it raises at that batch's position and is
never sent), a shared-memory slot for a producer that mapped the slab (while one is free), the codec of its
batch frames (:class:`~ferry.consumer.core.compression.TaskCodecs`) and what the run's kind adds (a shard's
batch, a stream's). Pure: the core calls it at the end of every event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferry.common import protocol
from ferry.common.errors import SampleIndexError

from ferry.consumer.core.actions import Send
from ferry.consumer.core.compression import TaskCodecs
from ferry.consumer.core.delivery import Delivery
from ferry.consumer.core.dispatcher import Dispatcher
from ferry.consumer.core.sequencers import Sequencer
from ferry.consumer.core.slots import SlotLedger

__all__ = ["TaskHeader", "issue"]


@dataclass(frozen=True)
class TaskHeader:
    """What every TASK of a run says besides its own fields."""

    session: int
    epoch: int
    on_error: str
    seed: int


def issue(dispatcher: Dispatcher, sequencer: Sequencer, slots: SlotLedger, codecs: TaskCodecs, common: TaskHeader,
          *, dataset_len: int | None, now: float) -> list[Send]:
    """Issue as many tasks as credits and free slots allow; the TASKs to send."""
    out = []
    bound = sequencer.index_range(dataset_len)  # an iterable run's indices name streams, not samples
    for task in dispatcher.assign(sequencer.held, now):
        indices = sequencer.indices(task.seq)
        bad = next((i for i in indices if not 0 <= i < bound), None) if bound is not None else None
        if bad is not None:  # raised at this batch's position, at once; its credit passes to the error
            dispatcher.drop(task.task)
            sequencer.put(Delivery(run=task.run, seq=task.seq, error=SampleIndexError(
                index=bad, length=bound, epoch=common.epoch, seq=task.seq)))
            continue
        extra: dict[str, Any] = {}
        info = dispatcher.producers[task.peer]
        if info.shared:
            slot = slots.lend(task.task, info.identity)
            if slot is not None:  # none free (the loop holds many batches): this one goes over the socket
                extra["slot"] = list(slot)
        codec = codecs.for_task(task.task, info.remote)
        if codec != "none":
            extra["compression"] = codec
        out.append(Send(task.peer, [protocol.pack(
            protocol.TASK, session=common.session, task=task.task, epoch=common.epoch, seq=task.seq,
            indices=indices, on_error=common.on_error, seed=common.seed, **extra, **sequencer.task_fields(task.seq),
        )], task=task.task))
    return out
