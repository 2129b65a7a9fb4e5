"""The consumer's io thread (docs/ARCHITECTURE.md#io-thread): the only user of the ROUTER socket.

A thin loop around :class:`~ferry.consumer.core.consumer.ConsumerCore`, which holds every protocol rule. Each
turn it polls the ROUTER and a :class:`~ferry.common.waker.Waker`, then feeds the core its events: the
commands the training thread queued (start a run, a batch released, a local producer died, close), a bounded
burst of received messages, and a heartbeat tick. It applies the actions the core returns, in order: sends,
log lines, and deliveries into ``handoff``, the queue the staging thread drains.

Other threads read the core's state through :meth:`IoThread.health` and :meth:`IoThread.snapshot`, under
``_lock``. The io thread changes that state only under the same lock (each event), and applies the actions
after releasing it: *decide under the lock, act after*. An unexpected exception ends the loop and is kept for
the training thread to re-raise. Shutdown (the close command): BYE to every producer, then close the socket once
each has answered it (bounded: :meth:`~ferry.consumer.io.router.Router.close`).
"""

from __future__ import annotations

import logging
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import zmq

from ferry.common.shm import process_exists
from ferry.common.waker import Waker

from ferry.consumer.core import Action, ConsumerCore, CoreConfig, Deliver, Log, Send, Sequencer
from ferry.consumer.figures.counters import Counters
from ferry.consumer.io.credits import CreditReturns, coalesce
from ferry.consumer.io.router import Router

__all__ = ["IoThread", "IoHealth"]

log = logging.getLogger("ferry.consumer")

#: Messages received per turn of the loop, at most: commands and heartbeats are never starved.
RECEIVE_BURST = 256


@dataclass(frozen=True)
class IoHealth:
    """What the training thread needs to know of the io thread, read at one moment."""

    alive: bool
    failure: BaseException | None  # what ended the thread, if it failed
    live_producers: int
    producers_seen: int  # registered, in all
    no_producer_since: float  # time.monotonic() when the last live producer was lost (or the thread began)
    progress_at: float  # when a result last arrived, or nothing was owed by producers
    churn: int  # producers lost since progress_at
    last_loss: str  # the latest of those losses, in words
    refused: str = ""  # the latest pool producer's refusal to load the dataset this consumer named, in words
    rejected: int = 0  # producers' HELLOs rejected, in all
    last_rejection: str = ""  # the latest: which producer, and why


class IoThread:
    """Owns the :class:`~ferry.consumer.io.router.Router`, the waker and the core; see the module docstring.

    Args:
        config: what the core is told once.
        endpoints: where the ROUTER binds.
        handoff: where deliveries go, in the order the training loop must see them.
        counters: the loader's figures (the io thread writes what arrives).
        curve: a CURVE server, or None.
        slab: the local producers' shared-memory slab, or None.
    """

    def __init__(self, config: CoreConfig, *, endpoints: tuple[str, ...], handoff: "queue.Queue[Any]",
                 counters: Counters, curve: Any = None, slab: Any = None) -> None:
        self.config = config
        self._handoff = handoff
        self._core = ConsumerCore(config, session=secrets.randbits(62) | 1, now=time.monotonic(),
                                  counters=counters, slab=slab)
        self._dataset_known = threading.Event()
        self._failure: BaseException | None = None
        self._closed_here = False  # close() was called on this thread itself (by the gc, through a finalizer)
        # events for the core, or a run whose batch the training loop took (an int: a credit back), or None: close
        self._commands: queue.SimpleQueue[Callable[[float], list[Action]] | int | None] = queue.SimpleQueue()
        self._waker = Waker()
        self._credits = CreditReturns(self._commands, self._waker.wake, config.capacity)  # the training thread's
        try:
            self._router = Router(endpoints, max_batch_bytes=config.max_batch_bytes, curve=curve,
                                  give_up_after=config.heartbeat * config.liveness)
        except BaseException:
            self._waker.close()
            raise
        # guards the core against readers on other threads; the io thread changes the core only under it,
        # and never sends or logs while holding it
        self._lock = threading.Lock()
        self._unsent: list[tuple[bytes, tuple[int, ...]]] = []  # TASKs that found no one, told after what waits
        self._settling = False  # in _settle_unsent, whose rounds take the unsent that its own events make
        self._thread = threading.Thread(target=self._main, name="ferry-io", daemon=True)
        self._note_dataset()

    # --- called from other threads ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def start_run(self, sequencer: Sequencer, epoch: int) -> None:
        """Begin a run (the training thread's new iteration); its deliveries follow in ``handoff``."""
        self._command(lambda now: self._core.start_run(sequencer, epoch, now))

    def release(self, run: int) -> None:
        """The training loop took one batch (or error) of ``run``: a credit back, the io thread woken for every
        group of them (:mod:`ferry.consumer.io.credits`)."""
        self._credits.release(run)

    def flush_credits(self) -> None:
        """The training loop is about to wait for a batch: the io thread is woken for the credits queued since."""
        self._credits.flush()

    def producer_died(self, pid: int, why: str) -> None:
        """From any thread: the producer process ``pid`` on this host has died (a local producer)."""
        self.producer_gone(f"{socket.gethostname()}:{pid}", why)

    def producer_gone(self, name: str, why: str) -> None:
        """From any thread: the producer process ``name`` (``host:pid``, on any host) has died, as its supervisor
        knows (an engine, local mode): the core loses it now, not after the liveness window."""
        self._command(lambda now: self._core.producer_died(name, why, now))

    def producer_leaving(self, pid: int, timeout: float) -> bool:
        """From any thread but this one: the local producer ``pid`` is about to be asked to stop (a scale-down).
        The core lets it go first (its tasks cost no attempt); this waits until it has, at most ``timeout``
        seconds. [Unit: second] Returns whether it has (False: the io thread is closing or gone)."""
        name, done = f"{socket.gethostname()}:{pid}", threading.Event()

        def leaving(now: float) -> list[Action]:
            actions = self._core.producer_leaving(name, now)
            done.set()  # no TASK goes to it from here on
            return actions

        self._command(leaving)
        return done.wait(timeout)

    def close(self, timeout: float) -> None:
        if self._thread is threading.current_thread():  # the gc ran the loader's shutdown on this thread
            self._closed_here = True  # its run ends at its next turn and releases what close() would
            self._commands.put(None)
            return
        if self._thread.is_alive():
            self._commands.put(None)
            self._waker.wake()
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._router.close(self._core.dispatcher.producers)  # never started, or died: release what it owned
            self._core.stop()  # batches it held are let go (with their slots)
        self._waker.close()

    def _command(self, event: Callable[[float], list[Action]]) -> None:
        self._commands.put(event)
        self._waker.wake()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def health(self) -> IoHealth:
        alive = self._thread.is_alive()  # before the failure: a thread that failed has set it before it ended
        with self._lock:
            peers = self._core.peers
            return IoHealth(alive=alive, failure=self._failure, live_producers=len(self._core.dispatcher.producers),
                            producers_seen=peers.seen, no_producer_since=peers.none_since,
                            progress_at=peers.progress_at, churn=peers.churn, last_loss=peers.last_loss,
                            refused=peers.refused, rejected=peers.rejected, last_rejection=peers.last_rejection)

    def wait_dataset(self, timeout: float) -> tuple[int, bool] | None:
        """``(length, sharded)`` of the dataset once known (given, or from the first producer admitted); None if
        it is not known within ``timeout`` seconds. A sharded dataset's length is its shard count."""
        if not self._dataset_known.wait(timeout):
            return None
        with self._lock:
            return self._core.peers.dataset_len, self._core.sharded

    def iterable(self) -> tuple[bool, int | None]:
        """Whether the first producer admitted announced an iterable dataset, and its ``len(dataset)`` (None where
        it has none). Ask once :meth:`wait_dataset` said the dataset is known."""
        with self._lock:
            return self._core.peers.iterable, self._core.peers.iterable_len

    def shard_lengths(self) -> list[int] | None:
        """Each shard's samples, as the producers announced them; None where they did not (or not yet)."""
        with self._lock:
            return self._core.peers.shard_lengths

    def report_load(self, needed: int | None, stall: float) -> None:
        """What the next PINGs tell every producer (the training thread's demand sample): the producers the loop needs
        (``needed``; None: not known yet) and its recent stall fraction. A pool exports them per job."""
        load = {"stall": round(stall, 4), **({"needed": needed} if needed is not None else {})}
        with self._lock:
            self._core.load = load

    def snapshot(self) -> dict[str, Any]:
        """A consistent view for stats(), read under the lock every event takes."""
        with self._lock:
            return self._core.figures(time.monotonic())

    # --- the thread ---------------------------------------------------------------------------------------
    def _main(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router.sock, zmq.POLLIN)
        poller.register(self._waker.fileno(), zmq.POLLIN)
        next_beat = time.monotonic()
        try:
            while True:
                timeout_ms = max(0, int((next_beat - time.monotonic()) * 1000))
                events = dict(poller.poll(timeout=min(timeout_ms, 100)))
                if self._waker.fileno() in events:
                    self._waker.drain()
                if self._router.sock in events:  # first: a producer's last BATCHes before the news of its death
                    self._receive()
                if not self._run_commands():
                    break
                now = time.monotonic()
                if now >= next_beat:
                    with self._lock:
                        holders = self._core.slots.holders()
                    exited = {pid for pid in holders if not process_exists(pid)}
                    self._event(lambda now: self._core.tick(now, exited))
                    next_beat = now + self.config.heartbeat
        except BaseException as exc:  # a bug: keep it for the training thread, which re-raises it
            log.exception("ferry io thread failed")
            with self._lock:
                self._failure = exc
        finally:
            self._router.close(self._core.dispatcher.producers)  # BYE to every producer
            if self._closed_here:  # nobody joins this thread to release the rest
                self._core.stop()
                self._waker.close()

    def _run_commands(self) -> bool:
        """Run what the training thread queued, in order, the credits of a run given back together; False once
        told to close."""
        for command in coalesce(self._queued()):
            if command is None:
                return False
            if isinstance(command, tuple):
                run, count = command
                self._event(lambda now: self._core.released(run, now, count))
            else:
                self._event(command)
        return True

    def _queued(self) -> Iterator[Any]:
        """What the command queue holds now (None, the close, ends it)."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            yield command
            if command is None:
                return

    def _receive(self) -> None:
        """Every message waiting (at most RECEIVE_BURST), fed to the core as one event: one turn of the lock, and
        the tasks their credits allow issued once, after the last."""
        burst = []
        for _ in range(RECEIVE_BURST):
            frames = self._router.recv()
            if frames is None:
                break
            burst.append(([frame.buffer for frame in frames], frames, peer_address(frames[-1])))
        if burst:
            self._event(lambda now: self._core.received_burst(burst, now))

    def _event(self, event: Callable[[float], list[Action]]) -> None:
        """Feed the core one event under the lock, then apply its actions outside it."""
        with self._lock:
            actions = event(time.monotonic())
        self._apply(actions)
        if not self._dataset_known.is_set():
            self._note_dataset()
        if self._unsent and not self._settling:
            self._settle_unsent()

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                self._handoff.put(action.item)
            elif isinstance(action, Send):
                if not self._router.send(action.peer, action.frames) and action.tasks:
                    self._unsent.append((action.peer, action.tasks))
            elif isinstance(action, Log):
                log.log(action.level, "%s", action.message)

    def _settle_unsent(self) -> None:
        """TASKs found their producer gone (its connection closed). What it sent before it went is read first: a
        BYE among it is the orderly leave it was, its tasks free of any attempt; only then is a producer still
        registered lost as unreachable (charged: it may have crashed). Each round loses every producer named, so
        a round's own TASKs can fail only for producers still registered: at most one round more than those."""
        self._settling = True
        try:
            for _ in range(len(self._core.dispatcher.producers) + 1):
                unsent, self._unsent = self._unsent, []
                self._receive()  # may lose some of them (a BYE): their unsent then changes nothing
                for peer, tasks in unsent:
                    self._event(lambda now, peer=peer, tasks=tasks: self._core.unsent(peer, tasks, now))
                if not self._unsent:
                    return
        finally:
            self._settling = False

    def _note_dataset(self) -> None:
        with self._lock:
            known = self._core.peers.dataset_known
        if known:
            self._dataset_known.set()


def peer_address(frame: zmq.Frame) -> str:
    """Where a received message came from, as ZeroMQ reports it: the peer's IP over tcp, its credentials over
    ipc, "" where the transport says nothing (inproc). The core tells local links from remote ones by it."""
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return ""
