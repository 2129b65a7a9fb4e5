"""The consumer's protocol logic as one state machine: events in, actions out (docs/ARCHITECTURE.md#io-thread).

No sockets, no threads, no clock: the io thread (:mod:`ferry.consumer.io.thread`) polls the socket, passes
``now`` with every event, and applies the :mod:`~ferry.consumer.core.actions` it gets back. Events:

* :meth:`ConsumerCore.received`: a message from a peer (HELLO, BATCH, FAIL, PING, BYE, or anything invalid);
* :meth:`~ConsumerCore.tick`: a heartbeat (ping the live producers, lose silent or overdue ones, reclaim the
  slots of lost producers that exited);
* :meth:`~ConsumerCore.start_run`, :meth:`~ConsumerCore.released`: the training loop began an iteration, or
  took a batch (a credit back);
* :meth:`~ConsumerCore.producer_died`: a local producer's process died (seen through its sentinel);
* :meth:`~ConsumerCore.producer_leaving`: a local producer is about to be asked to stop (a scale-down);
* :meth:`~ConsumerCore.unsent`: a TASK could not be sent.

Each event ends by issuing what credits allow and handing on what is ready, in order. The parts it drives
hold the rules: what a HELLO or a stranger gets (:mod:`.greeting`), admission and liveness
(:mod:`.admission`), credits, tasks and attempts (:mod:`.dispatcher`), the run's order and reorder buffer (:mod:`.sequencers`, :mod:`.shards`, :mod:`.streams`), what a BATCH or FAIL
does (:mod:`.answers`, with the checks of :mod:`.results`), what a TASK says (:mod:`.issuing`), the codec each
TASK names (:mod:`.compression`) and the shared-memory slots (:mod:`.slots`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

from ferry.common import protocol
from ferry.common.constants import DEAL_FIRST_TASKS_S
from ferry.common.errors import PoisonTaskError, ProtocolError, VersionMismatch

from ferry.consumer.core.actions import Action, Deliver, Log, Send
from ferry.consumer.core.admission import Loss, Peers, same_user_ipc
from ferry.consumer.core.compression import TaskCodecs
from ferry.consumer.core.delivery import Delivery
from ferry.consumer.core.dispatcher import Attempt, Dispatcher, Poisoned, ProducerInfo, Task
from ferry.consumer.core.answers import Answers, Unusable
from ferry.consumer.core.greeting import Greeting
from ferry.consumer.core.issuing import TaskHeader, issue
from ferry.consumer.core.results import check_fail
from ferry.consumer.core.sequencers import Sequencer
from ferry.consumer.core.slots import SlotLedger
from ferry.consumer.figures.counters import Counters

__all__ = ["CoreConfig", "ConsumerCore"]

_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR


@dataclass(frozen=True)
class CoreConfig:
    """What the core is told once: see ``RemoteLoader``'s options of the same names."""

    capacity: int  # buffer_batches
    heartbeat: float
    liveness: int
    task_timeout: float
    on_error: str
    max_batch_bytes: int
    max_attempts: int
    seed: int = 0  # the loader's seed, sent with every TASK for sample_info()
    dataset_len: int | None = None
    fingerprint: str | None = None
    dataset_spec: str | None = None  # admit only producers announcing this spec (named to pools: common/pool.py)
    dataset_args: dict[str, Any] | None = None  # named with dataset_spec to pool producers
    weight: float = 1.0  # this consumer's share of a pool producer's time, against its other consumers' (WELCOME)
    compression: str = "none"  # auto, lz4, zstd or none: each TASK names the codec for its batch
    codecs: tuple[str, ...] = ()  # the codecs this consumer can decompress (told in WELCOME)
    local_producers: int = 0  # started with this loader: one first task to each, the rest when all are live
    # the trainer's own canary samples (ferry.common.canary.Canary), which a producer's must match; None: those of
    # the first producer admitted that announces some
    canaries: tuple[Any, ...] | None = None
    code: str | None = None  # the digest of dataset_spec's module source in this trainer's copy (common/canary.py)


class ConsumerCore:
    """See the module docstring. ``slab``: the shared-memory slab of local producers, or None."""

    def __init__(self, config: CoreConfig, *, session: int, now: float, counters: Counters, slab: Any = None) -> None:
        self.config = config
        self.session = session
        self.counters = counters
        self.slab = slab
        self.dispatcher = Dispatcher(config.capacity, config.max_attempts, deal_to=config.local_producers,
                                     deal_until=now + DEAL_FIRST_TASKS_S)
        self.peers = Peers(self.dispatcher, dataset_len=config.dataset_len, fingerprint=config.fingerprint,
                           shm_token=slab.token if slab is not None else None, now=now,
                           dataset_spec=config.dataset_spec, dataset_args=config.dataset_args,
                           canaries=config.canaries, code=config.code)
        self.slots = SlotLedger(slab)
        # HELLOs, strangers and invalid messages: who is welcomed, named our dataset, rejected (core/greeting.py)
        self.greeting = Greeting(config, session=session, peers=self.peers, counters=counters,
                                 describe=self.peers.describe)
        # the codec each TASK names; under "auto", decided from what arrives (core/compression.py)
        self.codecs = TaskCodecs(config.compression, config.codecs)
        self.answers = Answers(session=session, on_error=config.on_error, max_batch_bytes=config.max_batch_bytes,
                               dispatcher=self.dispatcher, slots=self.slots, codecs=self.codecs, counters=counters)
        self._epoch = 0
        self._out: list[Action] = []
        # what every PING tells the producers: the demand gauge's value ("needed") and the loop's recent stall,
        # which a pool producer exports per job (producer/core/sharing.py); set by the io thread's report_load
        self.load: dict[str, float] = {}
        self.dispatcher.occupancy(now)

    @property
    def sequencer(self) -> Sequencer | None:
        return self.dispatcher.sequencer

    @property
    def sharded(self) -> bool:
        """An admitted producer serves a sharded dataset (its HELLO said ``dataset.sharded``)."""
        return self.greeting.sharded

    @property
    def held(self) -> int:
        """Batches of the current run put into its reorder buffer and not yet released by the training loop."""
        return self.sequencer.held if self.sequencer is not None else 0

    # --- events -------------------------------------------------------------------------------------------
    def start_run(self, sequencer: Sequencer, epoch: int, now: float) -> list[Action]:
        """The training loop began an iteration: forget the old run's tasks and items, issue ``sequencer``'s."""
        self._epoch = epoch
        self.dispatcher.start_run(sequencer)
        self.codecs.clear()  # the old run's tasks are forgotten: their late results are duplicates
        self.peers.progressed(now)
        return self._finish(now)

    def released(self, run: int, now: float, count: int = 1) -> list[Action]:
        """The training loop took ``count`` batches (or errors) of ``run``: as many credits back, unless the run is
        over. The training thread returns them in groups (consumer/io/thread.py), so one event may carry several."""
        if self.sequencer is not None and self.sequencer.run == run:
            for _ in range(count):
                self.sequencer.release()
        return self._finish(now)

    def received(self, frames: list[Any], now: float, keep: Any = None, address: str = "") -> list[Action]:
        """A message off the ROUTER: ``frames[0]`` the sender's routing id, ``frames[1]`` the header, then its
        data frames (buffers). ``keep`` travels with a decoded batch (the frames its views need); ``address``
        is the sender's as ZeroMQ reports it (``Peer-Address``: an IP over tcp), which tells a local link
        from a remote one. An invalid message is counted, logged once per peer, and dropped."""
        self._receive_one(frames, now, keep, address)
        return self._finish(now)

    def received_burst(self, messages: Iterable[tuple[list[Any], Any, str]], now: float) -> list[Action]:
        """Several messages that were waiting at once, each ``(frames, keep, address)`` as :meth:`received` takes
        them, in the order they arrived: the same as one :meth:`received` each, but the tasks their credits allow
        are issued once, after the last (so a producer's several tasks can travel in one TASK)."""
        for frames, keep, address in messages:
            self._receive_one(frames, now, keep, address)
        return self._finish(now)

    def _receive_one(self, frames: list[Any], now: float, keep: Any, address: str) -> None:
        if len(frames) < 2:
            self.counters.invalid_messages += 1
            return
        peer = bytes(frames[0])
        try:
            header = protocol.parse_header(frames[1])
            self._handle(peer, header, frames[2:], now, keep, address)
        except VersionMismatch as exc:
            self._invalid(peer, str(exc), now)
            if exc.msg_type == protocol.HELLO:  # tell the producer why it will never be served
                self._send(peer, protocol.REJECT, reason=str(exc), permanent=True)
        except ProtocolError as exc:
            self._invalid(peer, str(exc), now)

    def tick(self, now: float, exited: Iterable[int] = ()) -> list[Action]:
        """A heartbeat. ``exited``: which of :meth:`SlotLedger.holders`'s processes have exited."""
        self.slots.reclaim(set(exited))
        c = self.config
        losses, alive = self.peers.expire(now, heartbeat=c.heartbeat, liveness=c.liveness,
                                          task_timeout=c.task_timeout)
        if not self.dispatcher.in_flight and (not self.dispatcher.queued or self.held >= c.capacity):
            self.peers.progressed(now)  # nothing owed: waiting on the training loop, not on producers
        self._settle(losses)
        for peer in alive:
            self._send(peer, protocol.PING, load=dict(self.load))
        return self._finish(now)

    def producer_died(self, name: str, why: str, now: float) -> list[Action]:
        """The producer process ``name`` (host:pid) died: lose it now, not after the liveness window."""
        self.dispatcher.end_dealing()  # the producers the first tasks wait for may not all come
        for peer in [p.peer for p in self.dispatcher.producers.values() if p.name == name]:
            self._lose(peer, why, now, charge=True)
        return self._finish(now)

    def producer_leaving(self, name: str, now: float) -> list[Action]:
        """The local producer process ``name`` (host:pid) is about to be asked to stop: let it go now, as if it had
        said BYE (its tasks cost no attempt), before its socket closes: a TASK sent to it after that would find
        no one and cost its tasks an attempt ("unreachable") while its BYE still waited to be read."""
        self.dispatcher.end_dealing()
        self.greeting.leaving(name)  # never admitted again
        for peer in [p.peer for p in self.dispatcher.producers.values() if p.name == name]:
            self._lose(peer, "asked to stop: fewer producers needed", now, level=_INFO)
        return self._finish(now)

    def unsent(self, peer: bytes, task_ids: Iterable[int], now: float) -> list[Action]:
        """The TASK carrying ``task_ids`` never reached ``peer``: their slots are free, and the producer is lost; the
        tasks it did get may have been at fault (it may have crashed), those ``task_ids`` cannot have been."""
        unsent = set(task_ids)
        for task_id in unsent:
            self.slots.give_back(task_id)
        info = self.dispatcher.producers.get(peer)
        if info is not None:
            self._lose(peer, "unreachable", now, charge=True, charged=info.in_flight - unsent)
        self.dispatcher.take_back(unsent)  # those its new connection holds, if it came back on one since
        return self._finish(now)

    def stop(self) -> None:
        """The loader closed: forget the run, so that the batches it still held (and their slots) are let go."""
        self.dispatcher.start_run(None)

    # --- receiving ----------------------------------------------------------------------------------------
    def _handle(self, peer: bytes, header: dict[str, Any], data: list[Any], now: float, keep: Any,
                address: str) -> None:
        kind = header["type"]
        if kind == protocol.HELLO:
            if data:
                raise ProtocolError(f"HELLO with {len(data)} extra frames")
            actions, losses = self.greeting.hello(peer, header, now, address)
            self._settle(losses)
            self._out += actions
            return
        info = self.dispatcher.producers.get(peer)
        if info is None:
            self._out += self.greeting.stranger(peer, header, now)
            return
        info.last_heard = now
        if kind == protocol.BATCH:
            self._batch(info, header, data, now, keep, address)
        elif kind == protocol.FAIL:
            self._fail(info, header, data, now)
        elif kind == protocol.BYE:
            self._lose(peer, "said BYE", now, level=_INFO)  # an orderly leave: its tasks cost no attempt, no alarm
        elif kind == protocol.PING:
            if data:
                raise ProtocolError("PING with extra frames")
        else:
            raise ProtocolError(f"unexpected {kind} from a producer")

    def _invalid(self, peer: bytes, reason: str, now: float) -> None:
        self._out += self.greeting.invalid(peer, reason, now)

    def _batch(self, info: ProducerInfo, header: dict[str, Any], data: list[Any], now: float, keep: Any,
               address: str) -> None:
        task = self._claim(info, header, now)
        if task is None:
            return
        assert self.sequencer is not None  # a task exists only within a run
        try:
            self._out += self.answers.batch(info, task, header, data, sequencer=self.sequencer, epoch=self._epoch,
                                            now=now, keep=keep,
                                            pickle_ok=info.pickle_ok and same_user_ipc(address))  # and still so
        except Unusable as exc:
            # it answered its own task with a batch we cannot use: broken or hostile. Re-issue the seq, and
            # drop and reject the producer, or a peer with many free slots would take the seq back every time
            self.dispatcher.requeue(task, Attempt(info.name, f"sent an unusable batch: {exc}"))
            self._poison(self.dispatcher.take_poisoned())
            self._lose(info.peer, f"sent an unusable batch: {exc}", now)
            self._send(info.peer, protocol.REJECT, permanent=True,
                       reason=f"rejected: your batch for seq {task.seq} was unusable: {exc}")
            raise

    def _fail(self, info: ProducerInfo, header: dict[str, Any], data: list[Any], now: float) -> None:
        check_fail(header, data)
        task = self._claim(info, header, now)
        if task is not None:
            assert self.sequencer is not None
            self._out += self.answers.fail(info, task, header, sequencer=self.sequencer, epoch=self._epoch,
                                           dataset_len=self.peers.dataset_len)

    def _claim(self, info: ProducerInfo, header: dict[str, Any], now: float) -> Task | None:
        task = self.answers.claim(info, header)
        if task is not None:
            self.peers.progressed(now)  # a result arrived: producers are not merely coming and going
        return task

    # --- losses -------------------------------------------------------------------------------------------
    def _lose(self, peer: bytes, why: str, now: float, *, charge: bool = False, charged: Iterable[int] | None = None,
              level: int = _WARNING) -> None:
        loss = self.peers.lose(peer, why, now, charge=charge, charged=charged)
        self._settle([loss] if loss is not None else [], level)

    def _settle(self, losses: Iterable[Loss], level: int = _WARNING) -> None:
        for loss in losses:
            self.slots.set_aside(loss.tasks, loss.pid)  # it may still be writing into their slots
            self.codecs.forget(loss.tasks)
            self._out.append(Log(level, f"producer {loss.name} lost ({loss.why}); {loss.live} live"))
            self._poison(loss.poisoned)

    def _poison(self, poisoned: Iterable[Poisoned]) -> None:
        """Seqs out of attempts: their error takes their place (the credit their task held passes to it)."""
        sequencer = self.sequencer
        for p in poisoned:
            assert sequencer is not None
            error = PoisonTaskError(epoch=self._epoch, seq=p.seq, indices=list(sequencer.indices(p.seq)),
                                    attempts=[(a.producer, a.cause) for a in p.attempts])
            self._out.append(Log(_ERROR, str(error)))
            sequencer.ended(p.seq, empty=False)  # a shard ends at its poisoned batch, as at a failed one
            sequencer.put(Delivery(run=p.run, seq=p.seq, error=error))

    # --- issuing and handing on ---------------------------------------------------------------------------
    def _finish(self, now: float) -> list[Action]:
        """Every event ends here: issue what credits allow, hand on what is ready, account producer occupancy
        (for the demand gauge); the actions, in order."""
        sequencer = self.sequencer
        if sequencer is not None:
            common = TaskHeader(self.session, self._epoch, self.config.on_error, self.config.seed)
            self._out += issue(self.dispatcher, sequencer, self.slots, self.codecs, common,
                               dataset_len=self.peers.dataset_len, now=now)
            while (item := sequencer.take()) is not None:
                self._out.append(Deliver(item))
        self.dispatcher.occupancy(now)
        out, self._out = self._out, []
        return out

    def _send(self, peer: bytes, kind: str, **fields: Any) -> None:
        self._out.append(Send(peer, [protocol.pack(kind, **fields)]))

    # --- figures ------------------------------------------------------------------------------------------
    def figures(self, now: float) -> dict[str, Any]:
        """A consistent view for ``stats()`` (read under the io thread's lock): ``buffered + in_flight`` is the
        credit bound's own sum."""
        return {
            "producers": len(self.dispatcher.producers),
            "producers_seen": self.peers.seen,
            "buffered": self.held,
            "in_flight": self.dispatcher.in_flight,
            "queued": self.dispatcher.queued,
            "reissued": self.dispatcher.reissued,
            "busy_s": self.dispatcher.busy_until(now),
            "per_producer": self.peers.figures(now),
            "shared_memory": None if self.slab is None else {
                "slots": self.slab.slots, "free": self.slab.free, "lost": self.slots.lost},
        }
