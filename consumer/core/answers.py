"""What a producer's answer to its task does: a BATCH or a FAIL, claimed, checked, and put in its place.

:class:`Answers` is one part of the core (:class:`~ferry.consumer.core.consumer.ConsumerCore` builds it with the
other parts it uses, and calls it for each BATCH and FAIL of a registered producer). An answer is *claimed*
against the task it names: only from the identity that holds that task, only in this session, else it is a
duplicate or stale and only counted. A claimed BATCH is checked against its run (:mod:`.sequencers`) and
decoded (:mod:`.results`); it then takes its seq's place in the reorder buffer, and under ``"auto"`` tells
the codec choice what it cost (:mod:`.compression`). A claimed FAIL puts its error in that place, or nothing
under ``on_error="skip"``. So does a BATCH holding a registered type this process has not registered
(:class:`~ferry.common.errors.BatchTypeError`, whatever ``on_error``): every producer would send the same, so it
is neither issued again nor held against its producer.

An answer that cannot be used raises :class:`Unusable` with its task: what that costs the producer (its seq
issued again, the producer lost and refused) is the core's to decide, since it touches the registry.
"""

from __future__ import annotations

import logging
from typing import Any

from ferry.common.errors import BatchTypeError, ProtocolError

from ferry.consumer.core.actions import Log
from ferry.consumer.core.compression import TaskCodecs
from ferry.consumer.core.delivery import Delivery
from ferry.consumer.core.dispatcher import Dispatcher, ProducerInfo, Task
from ferry.consumer.core.results import BatchDecoder, sample_error, skip_lines, unretryable
from ferry.consumer.core.sequencers import Sequencer
from ferry.consumer.core.slots import SlotLedger
from ferry.consumer.figures.counters import Counters, waited_so_far

__all__ = ["Answers", "Unusable"]


class Unusable(ProtocolError):
    """A producer answered its own task with a batch that cannot be used (broken or hostile)."""

    def __init__(self, task: Task, cause: ProtocolError) -> None:
        super().__init__(str(cause))
        self.task = task


class Answers:
    """See the module docstring. ``dataset_len`` reads the dataset's length once known (for FAIL's errors)."""

    def __init__(self, *, session: int, on_error: str, max_batch_bytes: int, dispatcher: Dispatcher,
                 slots: SlotLedger, codecs: TaskCodecs, counters: Counters) -> None:
        self.session, self.on_error = session, on_error
        self.dispatcher, self.slots, self.codecs, self.counters = dispatcher, slots, codecs, counters
        self.decoder = BatchDecoder(max_batch_bytes)

    def claim(self, info: ProducerInfo, header: dict[str, Any]) -> Task | None:
        """The task a BATCH or FAIL answers, or None (counted) for another session or a late duplicate."""
        if header["session"] != self.session:
            self.counters.stale += 1
            return None
        task = self.dispatcher.complete(header["task"], info.peer)
        if task is None:
            self.counters.duplicates += 1
            self.slots.give_back(header["task"], holder=info.identity)  # it has finished with the slot
        return task

    def batch(self, info: ProducerInfo, task: Task, header: dict[str, Any], data: list[Any], *,
              sequencer: Sequencer, epoch: int, now: float, keep: Any, pickle_ok: bool = False) -> list[Log]:
        """Check, decode and put the BATCH answering ``task``. Returns what to log. ``pickle_ok``: its producer may
        send pickled values (a local producer: ipc, this process's user; the core decides).

        Raises:
            Unusable: the batch does not answer its task as the run requires, or does not decode.
        """
        try:
            answer = sequencer.read_answer(header, task.seq, epoch)
            batch = None if answer.empty else self.decoder.decode(
                header, data, seq=task.seq, epoch=epoch, indices=answer.indices,
                region=self.slots.take_region(task.task), pickle_ok=pickle_ok)
        except BatchTypeError as exc:  # a registration this process lacks: raised at its batch
            self.codecs.forget([task.task])
            self.slots.give_back(task.task)
            sequencer.put(Delivery(run=task.run, seq=task.seq, error=BatchTypeError(
                f"{exc} (epoch {epoch}, batch {task.seq}, from producer {info.name})")))
            return []
        except ProtocolError as exc:
            raise Unusable(task, exc) from None
        if answer.last or answer.empty:
            sequencer.ended(task.seq, empty=answer.empty)  # before the put: delivery may move on past it
        if batch is None:  # the shard has no batch k: nothing to hand on, no credit held
            self.slots.give_back(task.task)
            return []
        info.batches += 1
        info.bytes += batch.nbytes
        c = self.counters
        c.shared_batches += batch.shared
        c.compressed_bytes += batch.compressed_bytes
        c.uncompressed_bytes += batch.uncompressed_bytes
        c.received += 1
        c.bytes += batch.nbytes
        logs = self._count_skips(header["errors"], info.name) if header["errors"] else []
        lines = self.codecs.arrived(task.task, batch.nbytes, sum(len(f) for f in data), batch.decode_s, now,
                                    waited_so_far(c, now))
        logs += [Log(logging.INFO, line) for line in lines]
        sequencer.put(Delivery(run=task.run, seq=task.seq, tree=batch.tree, nbytes=batch.nbytes, frames=keep))
        return logs

    def fail(self, info: ProducerInfo, task: Task, header: dict[str, Any], *, sequencer: Sequencer, epoch: int,
             dataset_len: int | None) -> list[Log]:
        """Put the error of the FAIL answering ``task`` in its place (nothing under ``on_error="skip"``, unless
        no producer could avoid it). Returns what to log."""
        self.codecs.forget([task.task])
        self.slots.give_back(task.task)
        errors = header["errors"]
        error = unretryable(errors, producer=info.name, epoch=epoch, seq=task.seq, dataset_len=dataset_len)
        logs: list[Log] = []
        if error is None:
            sequencer.ended(task.seq, empty=False)  # a shard whose iterator raised ends there
            if self.on_error == "skip":
                sequencer.put(Delivery(run=task.run, seq=task.seq, skipped=True))
                return self._count_skips(errors, info.name)
            error = sample_error(errors, producer=info.name, epoch=epoch, seq=task.seq)
        sequencer.put(Delivery(run=task.run, seq=task.seq, error=error))
        return logs

    def _count_skips(self, errors: list[dict[str, Any]], producer: str) -> list[Log]:
        before = self.counters.skipped_samples
        self.counters.skipped_samples += len(errors)
        return [Log(logging.WARNING, line) for line in skip_lines(errors, producer, before)]
