"""The consumer's io thread (docs/ARCHITECTURE.md#io-thread): the only user of the :class:`~ferry.consumer.io.router.Router` socket.

It runs one poll loop over the ROUTER and a :class:`~ferry.common.waker.Waker`. Each turn it
1. runs the commands the training thread queued (start a run, close),
2. receives a bounded burst of messages, validating each one; an invalid message is counted, logged
   once per peer, and dropped (it never raises out of the loop),
3. sends heartbeats, declares silent producers lost (their tasks go back to the front of the queue),
4. issues tasks while credits allow (:class:`~ferry.consumer.dispatcher.Dispatcher`).

What each message from a producer does is :mod:`ferry.consumer.io_inbound` (mixed into :class:`IoThread`).
Who is admitted is decided in :mod:`ferry.consumer.peers`, what a result may hold in
:mod:`ferry.consumer.results`, and which task holds which shared-memory slot in
:class:`~ferry.common.shm.SlotLedger`. Decoded batches (views of the received frames, no copy) go into the
:class:`~ferry.consumer.buffer.ReorderBuffer`.

Other threads read the state through :meth:`IoThread.health` and :meth:`IoThread.snapshot`, under ``_lock``.
The io thread changes that state under the same lock, deciding there what to do, and does the I/O (sends,
log lines, freeing slots) after releasing it. An unexpected exception ends the loop and is kept for the
training thread to re-raise. Shutdown (``close`` command): BYE to every producer, then close the socket.
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable

import zmq

from ferry.common import protocol
from ferry.common.errors import PoisonTaskError, SampleIndexError
from ferry.common.shm import SlotLedger
from ferry.common.waker import Waker

from ferry.consumer.buffer import Delivery, ReorderBuffer
from ferry.consumer.dispatcher import Poisoned
from ferry.consumer.io_inbound import Inbound
from ferry.consumer.peers import BadPeers, Loss, Peers
from ferry.consumer.results import BatchDecoder
from ferry.consumer.io.router import Router
from ferry.consumer.figures.counters import Counters, waited_so_far
from ferry.consumer.streaming import ShardDispatcher, task_fields

log = logging.getLogger("ferry.consumer")

@dataclass(frozen=True)
class IoConfig:
    endpoints: tuple[str, ...]
    capacity: int
    heartbeat: float
    liveness: int
    on_error: str
    max_batch_bytes: int
    task_timeout: float
    dataset_len: int | None
    fingerprint: str | None
    curve: Any = None
    slab: Any = None  # ferry.common.shm.Slab shared with local producers, owned by LocalProducers
    seed: int = 0  # the loader's seed, sent with every TASK for sample_info()
    max_attempts: int = 3  # a seq lost this many times raises PoisonTaskError in its place
    dataset_spec: str | None = None  # admit only producers announcing this spec (dataset= given as a string)
    compression: str = "none"  # told to producers in WELCOME: auto, lz4, zstd or none
    codecs: tuple[str, ...] = ()  # the codecs this consumer can decompress, told with it


@dataclass(frozen=True)
class StartRun:
    run: int
    epoch: int
    plan: Any  # EpochPlan
    order: list[int]  # the seqs to deliver, in plan order


@dataclass(frozen=True)
class IoHealth:
    """What the training thread needs to know of the io thread, read at one moment."""

    alive: bool
    failure: BaseException | None  # what ended the thread, if it failed
    live_producers: int
    producers_seen: int  # registered, in all
    no_producer_since: float  # time.monotonic() when the last live producer was lost (or the thread began)
    progress_at: float = 0.0  # when a result last arrived, or nothing was owed by producers
    churn: int = 0  # producers lost since progress_at
    last_loss: str = ""  # the latest of those losses, in words


class _Close:
    pass


@dataclass(frozen=True)
class _Died:
    """A local producer's process died (its sentinel said so): lose it now, not after the liveness window."""

    pid: int
    why: str


class IoThread(Inbound):
    """Owns the :class:`~ferry.consumer.io.router.Router` and the waker; see the module docstring."""

    def __init__(self, config: IoConfig, buffer: ReorderBuffer, counters: Counters, waker: Waker) -> None:
        self.config = config
        self.buffer = buffer
        self.counters = counters
        self.session = random.getrandbits(62) | 1
        self.dispatcher = ShardDispatcher(config.capacity, config.max_attempts)  # and sharded runs (consumer/streaming.py)
        self.slab = config.slab
        self._peers = Peers(self.dispatcher, dataset_len=config.dataset_len, fingerprint=config.fingerprint,
                            shm_token=self.slab.token if self.slab is not None else None, now=time.monotonic(),
                            dataset_spec=config.dataset_spec)
        self._bad_peers = BadPeers(self._peers.describe)
        self._ledger = SlotLedger(self.slab)
        self._decoder = BatchDecoder(config.max_batch_bytes)
        self._dataset_known = threading.Event()
        self.sharded = threading.Event()  # an admitted producer serves a sharded dataset (HELLO dataset.sharded)
        if self._peers.dataset_known:
            self._dataset_known.set()
        self._failure: BaseException | None = None
        self.waker = waker  # wakes the poll loop; owned (closed) by this object
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            self._router = Router(config.endpoints, max_batch_bytes=config.max_batch_bytes, curve=config.curve)
        except BaseException:
            waker.close()
            raise
        self._plan: Any = None
        self._epoch = 0
        # guards what other threads read (dispatcher, peers, failure, per-producer figures); the io thread
        # changes it only under this lock, and never sends or logs while holding it
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="ferry-io", daemon=True)

    # --- called from other threads ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def start_run(self, command: StartRun) -> None:
        self._commands.put(command)
        self.waker.wake()

    def producer_died(self, pid: int, why: str) -> None:
        """From any thread: the producer process ``pid`` on this host has died (a local producer)."""
        self._commands.put(_Died(pid, why))
        self.waker.wake()

    def close(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._commands.put(_Close())
            self.waker.wake()
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._router.close(self.dispatcher.producers)  # never started, or died: release what it owned
        self.waker.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def health(self) -> IoHealth:
        alive = self._thread.is_alive()  # before the failure: a thread that failed has set it before it ended
        with self._lock:
            return IoHealth(alive=alive, failure=self._failure, live_producers=len(self.dispatcher.producers),
                            producers_seen=self._peers.seen, no_producer_since=self._peers.none_since,
                            progress_at=self._peers.progress_at, churn=self._peers.churn,
                            last_loss=self._peers.last_loss)

    def wait_dataset_len(self, timeout: float) -> int | None:
        """The dataset's length once known (given, or from the first producer admitted); None if it is not
        known within ``timeout`` seconds."""
        if not self._dataset_known.wait(timeout):
            return None
        with self._lock:
            return self._peers.dataset_len

    def snapshot(self) -> dict[str, Any]:
        """A consistent view for stats(). ``buffered`` is read before ``in_flight``, both under the lock
        that task assignment takes: in between, ``held`` can only be released and tasks only completed,
        so ``buffered + in_flight`` never over-counts and the capacity bound can be checked from outside."""
        with self._lock:
            buffered = self.buffer.held
            in_flight = self.dispatcher.in_flight
            producers = self._peers.figures(time.monotonic())
            return {
                "producers": len(producers),
                "producers_seen": self._peers.seen,
                "buffered": buffered,
                "in_flight": in_flight,
                "queued": self.dispatcher.queued,
                "reissued": self.dispatcher.reissued,
                "per_producer": producers,
                "shared_memory": None if self.slab is None else {
                    "slots": self.slab.slots, "free": self.slab.free, "lost": self._ledger.lost},
            }

    # --- the thread ---------------------------------------------------------------------------------
    def _main(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router.sock, zmq.POLLIN)
        poller.register(self.waker.fileno(), zmq.POLLIN)
        next_beat = time.monotonic()
        try:
            while True:
                timeout_ms = max(0, int((next_beat - time.monotonic()) * 1000))
                events = dict(poller.poll(timeout=min(timeout_ms, 100)))
                if self.waker.fileno() in events:
                    self.waker.drain()
                if self._run_commands():
                    break
                if self._router.sock in events:
                    self._receive()
                now = time.monotonic()
                if now >= next_beat:
                    self._heartbeat(now)
                    next_beat = now + self.config.heartbeat
                self._dispatch()
        except BaseException as exc:  # a bug: keep it for the training thread, which re-raises it
            log.exception("ferry io thread failed")
            with self._lock:
                self._failure = exc
        finally:
            self._router.close(self.dispatcher.producers)  # BYE to every producer

    def _run_commands(self) -> bool:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            if isinstance(command, _Close):
                return True
            if isinstance(command, _Died):
                name = f"{socket.gethostname()}:{command.pid}"
                for peer in [p.peer for p in self.dispatcher.producers.values() if p.name == name]:
                    self._lose(peer, command.why, charge=True)
                continue
            with self._lock:
                self._plan, self._epoch = command.plan, command.epoch
                self.buffer.reset(command.run, command.order)
                self.dispatcher.start_run(command.run, command.order)
                self._peers.progressed(time.monotonic())

    # --- heartbeats, liveness, dispatch -------------------------------------------------------------
    def _heartbeat(self, now: float) -> None:
        self._ledger.reclaim()
        with self._lock:
            losses, alive = self._peers.expire(now, heartbeat=self.config.heartbeat, liveness=self.config.liveness,
                                               task_timeout=self.config.task_timeout)
            if not self.dispatcher.in_flight and (not self.dispatcher.queued
                                                  or self.buffer.held >= self.config.capacity):
                self._peers.progressed(now)  # nothing owed: waiting on the training loop, not on producers
        self._settle(losses)
        for peer in alive:
            self._router.send(peer, [protocol.pack(protocol.PING, load={})])

    def _lose(self, peer: bytes, why: str, *, charge: bool = False) -> None:
        with self._lock:
            loss = self._peers.lose(peer, why, time.monotonic(), charge=charge)
        self._settle([loss] if loss is not None else [])

    def _settle(self, losses: Iterable[Loss]) -> None:
        """Act on producers lost under the lock."""
        for loss in losses:
            self._ledger.set_aside(loss.tasks, loss.pid)  # it may still be writing into their slots
            log.warning("producer %s lost (%s); %d live", loss.name, loss.why, loss.live)
            self._poison(loss.poisoned)

    def _poison(self, poisoned: Iterable[Poisoned]) -> None:
        """Seqs out of attempts: their error takes their place in the reorder buffer (the credit their task
        held passes to it)."""
        for p in poisoned:
            error = PoisonTaskError(epoch=self._epoch, seq=p.seq, indices=list(self._plan.batch(p.seq)),
                                    attempts=[(a.producer, a.cause) for a in p.attempts])
            log.error("%s", error)
            if task_fields(self._plan, p.seq):  # a shard ends at its poisoned batch, as at a failed one
                self.buffer.end_shard(p.run, p.seq, last=True, empty=False)
            self.buffer.put(Delivery(run=p.run, seq=p.seq, error=error))

    def _out_of_range(self, indices: list[int]) -> int | None:
        """The first of ``indices`` outside the dataset, or None."""
        length = self._peers.dataset_len
        if length is None:
            return None
        return next((i for i in indices if not 0 <= i < length), None)

    def _dispatch(self) -> None:
        if self._plan is None:
            return
        with self._lock:
            tasks = self.dispatcher.assign(self.buffer.held, time.monotonic())
        for task in tasks:
            indices = self._plan.batch(task.seq)
            bad = self._out_of_range(indices)
            if bad is not None:  # raised at this batch's position, at once; its credit passes to the error
                with self._lock:
                    self.dispatcher.drop(task.task)
                self.buffer.put(Delivery(run=task.run, seq=task.seq, error=SampleIndexError(
                    index=bad, length=self._peers.dataset_len, epoch=self._epoch, seq=task.seq)))
                continue
            extra = {}
            info = self.dispatcher.producers.get(task.peer)
            if info is not None and info.shared:
                slot = self._ledger.lend(task.task, info.identity)
                if slot is not None:  # none free (the loop holds many batches): this one goes over the socket
                    extra["slot"] = list(slot)
            ok = self._router.send(task.peer, [protocol.pack(
                protocol.TASK, session=self.session, task=task.task, epoch=self._epoch, seq=task.seq,
                indices=indices, on_error=self.config.on_error, seed=self.config.seed,
                waited=round(waited_so_far(self.counters, time.monotonic()), 4), **extra,
                **task_fields(self._plan, task.seq),
            )])
            if not ok:
                self._ledger.give_back(task.task)  # the TASK never reached the producer
                self._lose(task.peer, "unreachable", charge=True)
