"""What the io thread does with each message a producer sends (docs/ARCHITECTURE.md#io-thread).

:class:`Inbound` is the receiving half of :class:`~ferry.consumer.io_thread.IoThread`: it takes a bounded
burst off the ROUTER, validates each message, and acts on it: HELLO (admission, through
:mod:`ferry.consumer.peers`), BATCH and FAIL (the task they answer, decoded and checked by
:mod:`ferry.consumer.results`, into the reorder buffer), BYE and PING, and messages from peers that are not
registered. An invalid message is counted, logged once per peer, and dropped; a producer that answers its
own task with an unusable batch is lost and rejected. It holds no state of its own: it works on the
io thread's, under the io thread's lock, and is only ever run by the io thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable

from ferry.common import protocol
from ferry.common.constants import DEFAULT_FRAME_BYTES
from ferry.common.errors import BatchTooLarge, ProtocolError, SampleIndexError, VersionMismatch
from ferry.common.shm import SlotLedger

from ferry.consumer.buffer import Delivery, ReorderBuffer
from ferry.consumer.dispatcher import Attempt, Poisoned, ProducerInfo, Task
from ferry.consumer.peers import BadPeers, Loss, Peers
from ferry.consumer.results import BatchDecoder, check_fail, count_skips, fail_delivery
from ferry.consumer.io.router import Router
from ferry.consumer.figures.counters import Counters
from ferry.consumer.streaming import ShardDispatcher, read_answer, task_fields

log = logging.getLogger("ferry.consumer")

_BURST = 256  # messages received per turn of the loop, at most


class Inbound:
    """The io thread's handling of producers' messages; mixed into :class:`~ferry.consumer.io_thread.IoThread`,
    which sets every attribute below and provides the three methods."""

    config: Any  # IoConfig: heartbeat, on_error
    session: int
    counters: Counters
    buffer: ReorderBuffer
    dispatcher: ShardDispatcher
    sharded: threading.Event
    _peers: Peers
    _bad_peers: BadPeers
    _ledger: SlotLedger
    _decoder: BatchDecoder
    _dataset_known: threading.Event
    _router: Router
    _lock: threading.Lock
    _plan: Any
    _epoch: int

    def _lose(self, peer: bytes, why: str, *, charge: bool = False) -> None:
        raise NotImplementedError

    def _settle(self, losses: Iterable[Loss]) -> None:
        raise NotImplementedError

    def _poison(self, poisoned: Iterable[Poisoned]) -> None:
        raise NotImplementedError

    # --- receiving ----------------------------------------------------------------------------------
    def _receive(self) -> None:
        for _ in range(_BURST):
            frames = self._router.recv()
            if frames is None:
                return
            if len(frames) < 2:
                self.counters.invalid_messages += 1
                continue
            peer = frames[0].bytes
            try:
                header = protocol.parse_header(frames[1])
                self._handle(peer, header, frames[2:])
            except VersionMismatch as exc:
                self._invalid(peer, str(exc))
                if exc.msg_type == protocol.HELLO:  # tell the producer why it will never be served
                    self._router.send(peer, [protocol.pack(protocol.REJECT, reason=str(exc), permanent=True)])
            except ProtocolError as exc:
                self._invalid(peer, str(exc))

    def _invalid(self, peer: bytes, reason: str) -> None:
        self.counters.invalid_messages += 1
        self._bad_peers.invalid(peer, reason)

    def _handle(self, peer: bytes, header: dict[str, Any], data: list[Any]) -> None:
        kind = header["type"]
        if kind == protocol.HELLO:
            if data:
                raise ProtocolError(f"HELLO with {len(data)} extra frames")
            self._hello(peer, header)
            return
        info = self.dispatcher.producers.get(peer)
        if info is None:
            self._stranger(peer, header)
            return
        info.last_heard = time.monotonic()
        if kind == protocol.BATCH:
            self._batch(info, header, data)
        elif kind == protocol.FAIL:
            self._fail(info, header, data)
        elif kind == protocol.BYE:
            self._lose(peer, "said BYE")
        elif kind == protocol.PING:
            if data:
                raise ProtocolError("PING with extra frames")
        else:
            raise ProtocolError(f"unexpected {kind} from a producer")

    def _stranger(self, peer: bytes, header: dict[str, Any]) -> None:
        """A message from a peer that is not (or no longer) registered."""
        kind = header["type"]
        if kind in (protocol.BATCH, protocol.FAIL):
            if header["session"] == self.session:
                self.counters.duplicates += 1  # the result of a task already re-issued
            else:
                self.counters.stale += 1
        elif kind not in (protocol.PING, protocol.BYE):
            raise ProtocolError(f"{kind} from an unregistered peer")
        if kind == protocol.BYE:
            return
        if self._bad_peers.reject_due(peer, time.monotonic(), self.config.heartbeat):
            hint = "unknown producer: say HELLO"
            self._router.send(peer, [protocol.pack(protocol.REJECT, reason=hint, permanent=False)])

    def _hello(self, peer: bytes, header: dict[str, Any]) -> None:
        with self._lock:
            admission = self._peers.admit(peer, header, time.monotonic())
        if admission.reject is not None:
            log.warning("rejected producer %s: %s", admission.name, admission.reject)
            self._router.send(peer, [protocol.pack(protocol.REJECT, reason=admission.reject, permanent=True)])
            return
        if header["dataset"].get("sharded") is True:
            self.sharded.set()
        if admission.adopted:
            log.info("producer %s set the dataset: %s", admission.name, admission.adopted)
        self._dataset_known.set()
        self._settle(admission.losses)
        if admission.joined is not None:
            log.info("producer %s joined (%d slots); %d live", admission.name, admission.joined.slots, admission.live)
        self._router.send(peer, [protocol.pack(protocol.WELCOME, session=self.session,
                                               heartbeat=self.config.heartbeat, nonce=header["nonce"],
                                               compression=self.config.compression,
                                               codecs=list(self.config.codecs),
                                               frame_bytes=DEFAULT_FRAME_BYTES,
                                               max_batch_bytes=self.config.max_batch_bytes)])

    # --- results ------------------------------------------------------------------------------------
    def _claim(self, info: ProducerInfo, header: dict[str, Any]) -> Task | None:
        """The task a BATCH or FAIL answers, or None (counted) for another session or a late duplicate."""
        if header["session"] != self.session:
            self.counters.stale += 1
            return None
        with self._lock:
            task = self.dispatcher.complete(header["task"], info.peer)
            if task is not None:
                self._peers.progressed(time.monotonic())
        if task is None:
            self.counters.duplicates += 1
            self._ledger.give_back(header["task"], holder=info.identity)  # it has finished with the slot
        return task

    def _batch(self, info: ProducerInfo, header: dict[str, Any], data: list[Any]) -> None:
        task = self._claim(info, header)
        if task is None:
            return
        try:
            answer = read_answer(header, self._plan, task.seq, self._epoch)  # a sharded run's (consumer/streaming.py)
            batch = None if answer.empty else self._decoder.decode(header, data, task, epoch=self._epoch,
                                                                   indices=answer.indices, ledger=self._ledger)
        except ProtocolError as exc:
            # it answered its own task with a batch we cannot use: broken or hostile. Re-issue the seq,
            # and drop and reject the producer, or a peer with many free slots would take the seq back
            # every time and stall the epoch.
            with self._lock:
                self.dispatcher.requeue(task, Attempt(info.name, f"sent an unusable batch: {exc}"))
                poisoned = self.dispatcher.take_poisoned()
            self._poison(poisoned)
            self._lose(info.peer, f"sent an unusable batch: {exc}")
            reason = f"rejected: your batch for seq {task.seq} was unusable: {exc}"
            self._router.send(info.peer, [protocol.pack(protocol.REJECT, permanent=True, reason=reason)])
            raise
        if answer.sharded:
            self.buffer.end_shard(task.run, task.seq, last=answer.last, empty=answer.empty)
        if batch is None:  # the shard has no batch k: nothing to hand on, no credit held
            self._ledger.give_back(task.task)
            return
        with self._lock:
            info.batches += 1
            info.bytes += batch.nbytes
        self.counters.shared_batches += batch.shared
        self.counters.compressed_bytes += batch.compressed_bytes
        self.counters.uncompressed_bytes += batch.uncompressed_bytes
        self.counters.received += 1
        self.counters.bytes += batch.nbytes
        if header["errors"]:
            count_skips(self.counters, info.name, header["errors"])
        self.buffer.put(Delivery(run=task.run, seq=task.seq, tree=batch.tree, nbytes=batch.nbytes, frames=data))

    def _unretryable(self, info: ProducerInfo, errors: list[dict[str, Any]], seq: int) -> Exception | None:
        """The error a FAIL names that no producer could avoid, or None: a sample index outside the dataset
        (the plan itself is wrong), or a batch larger than max_batch_bytes (every producer builds the same)."""
        kinds: dict[str, dict[str, Any]] = {}
        for error in errors:
            kinds.setdefault(error["exc_type"], error)  # the first of each kind names it
        if BatchTooLarge.__name__ in kinds:
            return BatchTooLarge(f"{kinds[BatchTooLarge.__name__]['message']} (epoch {self._epoch}, batch {seq}, "
                                 f"from producer {info.name})")
        if SampleIndexError.__name__ in kinds:
            return SampleIndexError(index=kinds[SampleIndexError.__name__]["index"],
                                    length=self._peers.dataset_len or 0, epoch=self._epoch, seq=seq)
        return None

    def _fail(self, info: ProducerInfo, header: dict[str, Any], data: list[Any]) -> None:
        check_fail(header, data)
        task = self._claim(info, header)
        if task is None:
            return
        self._ledger.give_back(task.task)
        error = self._unretryable(info, header["errors"], task.seq)
        if error is not None:  # raised at this batch's position whatever on_error says, never re-issued
            self.buffer.put(Delivery(run=task.run, seq=task.seq, error=error))
            return
        if task_fields(self._plan, task.seq):  # a shard whose iterator raised ends there
            self.buffer.end_shard(task.run, task.seq, last=True, empty=False)
        self.buffer.put(fail_delivery(header, task, info.name, epoch=self._epoch, on_error=self.config.on_error,
                                      counters=self.counters))
