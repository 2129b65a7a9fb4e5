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
from ferry.common.constants import MAX_TASK_INDICES
from ferry.common.errors import SampleIndexError

from ferry.consumer.core.actions import Send
from ferry.consumer.core.compression import TaskCodecs
from ferry.consumer.core.delivery import Delivery
from ferry.consumer.core.dispatcher import Dispatcher
from ferry.consumer.core.sequencers import Sequencer
from ferry.consumer.core.slots import SlotLedger

__all__ = ["TaskHeader", "issue", "bundle"]


@dataclass(frozen=True)
class TaskHeader:
    """What every TASK of a run says besides its own fields."""

    session: int
    epoch: int
    on_error: str
    seed: int


def issue(dispatcher: Dispatcher, sequencer: Sequencer, slots: SlotLedger, codecs: TaskCodecs, common: TaskHeader,
          *, dataset_len: int | None, now: float) -> list[Send]:
    """Issue as many tasks as credits and producers' room allow; the TASKs to send. A producer that takes several tasks
    per TASK (HELLO ``tasks``) gets those issued together in one (:func:`bundle`)."""
    issued: list[tuple[bytes, int, dict[str, Any]]] = []  # (peer, most per TASK, the task's own fields)
    bound = sequencer.index_range(dataset_len)  # an iterable run's indices name streams, not samples
    for task in dispatcher.assign(sequencer.held, now):
        indices = sequencer.indices(task.seq)
        bad = next((i for i in indices if not 0 <= i < bound), None) if bound is not None else None
        if bad is not None:  # raised at this batch's position, at once; its credit passes to the error
            dispatcher.drop(task.task)
            sequencer.put(Delivery(run=task.run, seq=task.seq, error=SampleIndexError(
                index=bad, length=bound, epoch=common.epoch, seq=task.seq)))
            continue
        own: dict[str, Any] = {"task": task.task, "seq": task.seq, "indices": indices}
        info = dispatcher.producers[task.peer]
        if info.shared:
            slot = slots.lend(task.task, info.identity)
            if slot is not None:  # none free (the loop holds many batches): this one goes over the socket
                own["slot"] = list(slot)
        codec = codecs.for_task(task.task, info.remote)
        if codec != "none":
            own["compression"] = codec
        own.update(sequencer.task_fields(task.seq))
        issued.append((task.peer, info.tasks_per_message, own))
    return bundle(issued, common)


def bundle(issued: list[tuple[bytes, int, dict[str, Any]]], common: TaskHeader) -> list[Send]:
    """The TASK messages for ``issued`` (peer, most tasks per TASK, the task's own fields), in issue order: each
    producer's tasks together, up to its most per TASK and MAX_TASK_INDICES indices in all (so a TASK stays
    well under MAX_HEADER_BYTES)."""
    groups: dict[bytes, list[list[dict[str, Any]]]] = {}
    for peer, most, own in issued:
        chunks = groups.setdefault(peer, [])
        last = chunks[-1] if chunks else None
        if (last is None or len(last) >= most
                or sum(len(t["indices"]) for t in last) + len(own["indices"]) > MAX_TASK_INDICES):
            chunks.append([own])
        else:
            last.append(own)
    out = []
    for peer, chunks in groups.items():
        for first, *more in chunks:
            fields = {**first, **({"more": more} if more else {})}
            out.append(Send(peer, [protocol.pack(protocol.TASK, session=common.session, epoch=common.epoch,
                                                 on_error=common.on_error, seed=common.seed, **fields)],
                            tasks=(first["task"], *(t["task"] for t in more))))
    return out
