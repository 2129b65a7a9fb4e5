"""The consumer's io thread (DESIGN §6.1): the only code that touches the ROUTER socket.

It runs one poll loop over the ROUTER and a :class:`~ferry.common.waker.Waker`. Each turn it
1. runs the commands the training thread queued (start a run, close),
2. receives a bounded burst of messages, validating each one; an invalid message is counted, logged
   once per peer, and dropped (it never raises out of the loop),
3. sends heartbeats, declares silent producers lost (their tasks go back to the front of the queue),
4. issues tasks while credits allow (:class:`~ferry.consumer.dispatcher.Dispatcher`).

Decoded batches go into the :class:`~ferry.consumer.buffer.ReorderBuffer`; decoding there is ``np.frombuffer``
over the received frames, no copy. An unexpected exception ends the loop and is kept in ``failure`` for
the training thread to re-raise.

Shutdown (``close`` command): BYE to every producer, close the ROUTER (short linger so BYE can leave),
terminate the context.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import zmq

from ferry.common import protocol
from ferry.common.codec import decode_tree, tree_nbytes, tree_signature
from ferry.common.constants import MAX_TRACKED_PEERS, SOCKET_HWM
from ferry.common.errors import ConfigError, ProtocolError, RemoteSampleError, VersionMismatch
from ferry.common.waker import Waker

from ferry.consumer.buffer import Delivery, ReorderBuffer
from ferry.consumer.dispatcher import Dispatcher, ProducerInfo
from ferry.consumer.stats import Counters

log = logging.getLogger("ferry.consumer")

BYE_LINGER_MS = 200
INVALID_LOG_BURST = 10  # invalid-message log lines per minute, over all peers
_BURST = 256


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


@dataclass(frozen=True)
class StartRun:
    run: int
    epoch: int
    plan: Any  # EpochPlan
    order: list[int]  # the seqs to deliver, in plan order


class _Close:
    pass


class IoThread:
    """Owns the ROUTER socket and its context; see the module docstring."""

    def __init__(self, config: IoConfig, buffer: ReorderBuffer, counters: Counters, waker: Waker) -> None:
        self.config = config
        self.buffer = buffer
        self.counters = counters
        self.session = random.getrandbits(62) | 1
        self.dispatcher = Dispatcher(config.capacity)
        self.dataset_len = config.dataset_len
        self.fingerprint = config.fingerprint
        self.dataset_known = threading.Event()
        if self.dataset_len is not None and self.fingerprint is not None:
            self.dataset_known.set()
        self.failure: BaseException | None = None
        self.waker = waker  # wakes the poll loop; owned (closed) by this object
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._auth = config.curve.start_authenticator(self._ctx) if config.curve is not None else None
        self._sock = self._bind()
        self._plan: Any = None
        self._signature: Any = None  # structure and dtypes of the first accepted batch
        self._epoch = 0
        self._first_name: str | None = None
        self._bad_peers: OrderedDict[bytes, float] = OrderedDict()  # peers logged / last REJECT sent
        self.slab = config.slab
        self._slot_of: dict[int, tuple[tuple[int, int], tuple[str, int]]] = {}  # task id -> (slot, identity)
        self._lost_slots: list[tuple[tuple[int, int], int]] = []  # (slot, pid) given up with a lost producer
        self._log_window, self._log_lines, self._log_suppressed = time.monotonic(), 0, 0
        self.producers_seen = 0
        self.no_producer_since = time.monotonic()
        # guards the dispatcher against stats() readers; re-entrant because _hello holds it while _lose
        # (which takes it too) drops the earlier registration of a producer that restarted its work
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._main, name="ferry-io", daemon=True)

    # --- called from other threads ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def start_run(self, command: StartRun) -> None:
        self._commands.put(command)
        self.waker.wake()

    def close(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._commands.put(_Close())
            self.waker.wake()
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self._ctx.closed:
            self._teardown()  # never started, or died: release what it owned
        self.waker.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def snapshot(self) -> dict[str, Any]:
        """A consistent view for stats(). ``buffered`` is read before ``in_flight``, both under the lock
        that task assignment takes: in between, ``held`` can only be released and tasks only completed,
        so ``buffered + in_flight`` never over-counts and the capacity bound can be checked from outside."""
        with self._lock:
            buffered = self.buffer.held
            in_flight = self.dispatcher.in_flight
            producers = {
                p.name: {"batches": p.batches, "bytes": p.bytes, "in_flight": len(p.in_flight), "slots": p.slots,
                         "joined_s": time.monotonic() - p.joined}
                for p in self.dispatcher.producers.values()
            }
            return {
                "producers": len(producers),
                "producers_seen": self.producers_seen,
                "buffered": buffered,
                "in_flight": in_flight,
                "queued": self.dispatcher.queued,
                "reissued": self.dispatcher.reissued,
                "per_producer": producers,
                "shared_memory": None if self.slab is None else {
                    "slots": self.slab.slots, "free": self.slab.free, "lost": len(self._lost_slots)},
            }

    # --- the thread ---------------------------------------------------------------------------------
    def _bind(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer raises instead of vanishing
        sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_batch_bytes)
        if self.config.curve is not None:
            self.config.curve.apply_server(sock)
        for endpoint in self.config.endpoints:
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                sock.close(0)
                if self._auth is not None:
                    self._auth.stop()
                self._ctx.term()
                self.waker.close()
                hint = " (is another trainer or rank already bound there?)" if exc.errno == zmq.EADDRINUSE else ""
                raise ConfigError(f"cannot bind the consumer to {endpoint}: {exc.strerror}{hint}") from None
        return sock

    def _main(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
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
                if self._sock in events:
                    self._receive()
                now = time.monotonic()
                if now >= next_beat:
                    self._heartbeat(now)
                    next_beat = now + self.config.heartbeat
                self._dispatch()
        except BaseException as exc:  # a bug: keep it for the training thread, which re-raises it
            log.exception("ferry io thread failed")
            self.failure = exc
        finally:
            self._teardown()

    def _teardown(self) -> None:
        if self._ctx.closed:
            return
        for peer in list(self.dispatcher.producers):
            self._send(peer, [protocol.pack(protocol.BYE)])
        self._sock.close(linger=BYE_LINGER_MS if self.dispatcher.producers else 0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    def _run_commands(self) -> bool:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            if isinstance(command, _Close):
                return True
            with self._lock:
                self._plan, self._epoch = command.plan, command.epoch
                self.buffer.reset(command.run, command.order)
                self.dispatcher.start_run(command.run, command.order)

    # --- receiving ----------------------------------------------------------------------------------
    def _receive(self) -> None:
        for _ in range(_BURST):
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
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
                    self._send(peer, [protocol.pack(protocol.REJECT, reason=str(exc), permanent=True)])
            except ProtocolError as exc:
                self._invalid(peer, str(exc))

    def _invalid(self, peer: bytes, reason: str) -> None:
        """Count; log once per peer, and at most INVALID_LOG_BURST lines a minute in all (a broken peer that
        keeps reconnecting gets a new routing id each time)."""
        self.counters.invalid_messages += 1
        if peer in self._bad_peers:
            return
        self._remember(peer, 0.0)
        now = time.monotonic()
        if now - self._log_window >= 60.0:
            if self._log_suppressed:
                log.warning("%d more invalid messages from other peers were dropped without a log line",
                            self._log_suppressed)
            self._log_window, self._log_lines, self._log_suppressed = now, 0, 0
        if self._log_lines < INVALID_LOG_BURST:
            self._log_lines += 1
            log.warning("invalid message from %s dropped: %s (further ones from this peer are only counted)",
                        self._name(peer), reason)
        else:
            self._log_suppressed += 1

    def _remember(self, peer: bytes, when: float) -> None:
        self._bad_peers[peer] = when
        self._bad_peers.move_to_end(peer)
        while len(self._bad_peers) > MAX_TRACKED_PEERS:
            self._bad_peers.popitem(last=False)

    def _name(self, peer: bytes) -> str:
        info = self.dispatcher.producers.get(peer)
        return f"producer {info.name}" if info else f"peer {peer.hex()}"

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
        now = time.monotonic()
        if now - self._bad_peers.get(peer, -1e9) >= self.config.heartbeat:
            self._remember(peer, now)
            self._send(peer, [protocol.pack(protocol.REJECT, reason="unknown producer: say HELLO", permanent=False)])

    def _hello(self, peer: bytes, header: dict[str, Any]) -> None:
        dataset = header["dataset"]
        name = f"{header['host']}:{header['pid']}"
        reason = self._check_dataset(dataset, name)
        if reason is not None:
            log.warning("rejected producer %s: %s", name, reason)
            self._send(peer, [protocol.pack(protocol.REJECT, reason=reason, permanent=True)])
            return
        identity = (header["producer"], header["nonce"])
        now = time.monotonic()
        with self._lock:
            current = self.dispatcher.producers.get(peer)
            if current is not None and current.identity == identity:
                pass  # a repeated HELLO: answer again, change nothing
            else:
                moved = self.dispatcher.find_identity(identity)
                if moved is not None:  # reconnected under a new routing id, same work in hand
                    if current is not None:
                        self._lose(peer, "replaced by a reconnection")
                    self.dispatcher.move(moved.peer, peer)
                else:
                    if current is not None:
                        self._lose(peer, "restarted its work (new HELLO)")
                    for other in list(self.dispatcher.producers.values()):
                        if other.producer_id == header["producer"]:
                            self._lose(other.peer, "restarted its work (new HELLO)")
                    shared = self.slab is not None and header.get("shm") == self.slab.token
                    self.dispatcher.add(ProducerInfo(
                        peer=peer, producer_id=header["producer"], nonce=header["nonce"], name=name,
                        slots=header["slots"], last_heard=now, joined=now, shared=shared, pid=header["pid"],
                    ))
                    self.producers_seen += 1
                    log.info("producer %s joined (%d slots); %d live", name, header["slots"],
                             len(self.dispatcher.producers))
        self._send(peer, [protocol.pack(protocol.WELCOME, session=self.session, heartbeat=self.config.heartbeat,
                                        nonce=header["nonce"])])

    def _check_dataset(self, dataset: dict[str, Any], name: str) -> str | None:
        if self.dataset_len is not None and dataset["len"] != self.dataset_len:
            return (f"dataset length {dataset['len']} (spec {dataset['spec']!r}) differs from this consumer's "
                    f"{self.dataset_len}" + (f" (first producer {self._first_name})" if self._first_name else ""))
        if self.fingerprint is not None and dataset["fingerprint"] != self.fingerprint:
            return (f"dataset fingerprint {dataset['fingerprint']!r} (spec {dataset['spec']!r}) differs from "
                    f"{self.fingerprint!r}" + (f" of the first producer {self._first_name}" if self._first_name else ""))
        if self.dataset_len is None or self.fingerprint is None:
            self.dataset_len, self.fingerprint, self._first_name = dataset["len"], dataset["fingerprint"], name
            self.dataset_known.set()
        return None

    def _claim(self, info: ProducerInfo, header: dict[str, Any]) -> Any:
        """The task a BATCH or FAIL answers, or None (counted) for another session or a late duplicate."""
        if header["session"] != self.session:
            self.counters.stale += 1
            return None
        task = self.dispatcher.complete(header["task"], info.peer)
        if task is None:
            self.counters.duplicates += 1
            held = self._slot_of.get(header["task"])
            if held is not None and held[1] == info.identity:  # it has finished with the slot
                self._give_back_slot(header["task"])
        return task

    def _take_slot(self, task_id: int) -> tuple[int, int] | None:
        held = self._slot_of.pop(task_id, None)
        return None if held is None else held[0]

    def _give_back_slot(self, task_id: int) -> None:
        """The task's slot (if it had one) is not in use: free it now."""
        slot = self._take_slot(task_id)
        if slot is not None:
            self.slab.give_back(slot)

    def _batch(self, info: ProducerInfo, header: dict[str, Any], data: list[Any]) -> None:
        task = self._claim(info, header)
        if task is None:
            return
        try:
            if (header["epoch"], header["seq"]) != (self._epoch, task.seq):
                raise ProtocolError(f"BATCH for task {header['task']} names seq {header['seq']}, expected {task.seq}")
            slot = self._take_slot(task.task)
            region = None if slot is None else self.slab.region(slot)  # free again once the batch is dropped
            tree = decode_tree(header["tree"], [f.buffer for f in data], max_bytes=self.config.max_batch_bytes,
                               region=region)
            del region
            self._check_structure(task, tree, header["errors"])
        except ProtocolError as exc:
            # it answered its own task with a batch we cannot use: broken or hostile. Re-issue the seq,
            # and drop and reject the producer, or a peer with many free slots would take the seq back
            # every time and stall the epoch.
            self.dispatcher.requeue(task)
            self._lose(info.peer, f"sent an unusable batch: {exc}")
            self._send(info.peer, [protocol.pack(protocol.REJECT, permanent=True,
                                                 reason=f"rejected: your batch for seq {task.seq} was unusable: {exc}")])
            raise
        nbytes = tree_nbytes(tree)
        if slot is not None and nbytes > sum(len(f) for f in data):
            self.counters.shared_batches += 1
        info.batches += 1
        info.bytes += nbytes
        self.counters.received += 1
        self.counters.bytes += nbytes
        if header["errors"]:
            self._count_skips(info, header["errors"])
        self.buffer.put(Delivery(run=task.run, seq=task.seq, tree=tree, nbytes=nbytes, producer=info.name,
                                 frames=data))

    def _check_structure(self, task: Any, tree: Any, errors: list[dict[str, Any]]) -> None:
        """A batch must hold exactly the samples its task asked for (less the ones reported failed), and
        have the structure and dtypes of the first batch accepted. Values cannot be checked; a peer that
        must not be trusted with them must not be let in (CURVE)."""
        indices = self._plan.batch(task.seq)
        if errors:
            asked = set(indices)
            stray = next((e["index"] for e in errors if e["index"] not in asked), None)
            if stray is not None:
                raise ProtocolError(f"BATCH reports sample {stray} failed, which task {task.task} did not ask for")
        signature = tree_signature(tree, len(indices) - len(errors))
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            raise ProtocolError("BATCH structure or dtypes differ from the first batch of this dataset")

    def _fail(self, info: ProducerInfo, header: dict[str, Any], data: list[Any]) -> None:
        if data or not header["errors"]:
            raise ProtocolError("FAIL must be one frame naming at least one error")
        task = self._claim(info, header)
        if task is None:
            return
        self._give_back_slot(task.task)
        if self.config.on_error == "skip":
            self._count_skips(info, header["errors"])
            self.buffer.put(Delivery(run=task.run, seq=task.seq, producer=info.name, skipped=True))
            return
        first = header["errors"][0]
        error = RemoteSampleError(index=first["index"], producer=info.name, exc_type=first["exc_type"],
                                  message=first["message"], traceback=first["traceback"],
                                  epoch=self._epoch, seq=task.seq)
        self.buffer.put(Delivery(run=task.run, seq=task.seq, producer=info.name, error=error))

    def _count_skips(self, info: ProducerInfo, errors: list[dict[str, Any]]) -> None:
        logged_before = self.counters.skipped_samples
        self.counters.skipped_samples += len(errors)
        if logged_before >= 10:  # the first few are logged; the rest only counted
            return
        for error in errors:
            log.warning("skipped sample %d (producer %s): %s: %s", error["index"], info.name,
                        error["exc_type"], error["message"].splitlines()[0] if error["message"] else "")

    # --- heartbeats, liveness, dispatch -------------------------------------------------------------
    def _heartbeat(self, now: float) -> None:
        if self._lost_slots:
            self._reclaim_slots()
        for peer in self.dispatcher.overdue(now - self.config.task_timeout):
            self._lose(peer, f"held a task for more than task_timeout={self.config.task_timeout:g} s")
        deadline = now - self.config.liveness * self.config.heartbeat
        for info in list(self.dispatcher.producers.values()):
            if info.last_heard < deadline:
                self._lose(info.peer, f"silent for {now - info.last_heard:.1f} s")
            else:
                self._send(info.peer, [protocol.pack(protocol.PING, load={})])

    def _lose(self, peer: bytes, why: str) -> None:
        with self._lock:
            held = self.dispatcher.producers.get(peer)
            tasks = list(held.in_flight) if held is not None else []
            info = self.dispatcher.lose(peer)
        if info is None:
            return
        for task_id in tasks:  # it may still be writing into these: reuse them only once it has exited
            slot = self._take_slot(task_id)
            if slot is not None:
                self._lost_slots.append((slot, info.pid))
        log.warning("producer %s lost (%s); %d live", info.name, why, len(self.dispatcher.producers))
        if not self.dispatcher.producers:
            self.no_producer_since = time.monotonic()

    def _reclaim_slots(self) -> None:
        """Slots of lost producers whose process has exited are safe to reuse."""
        kept = []
        for slot, pid in self._lost_slots:
            if _process_exists(pid):
                kept.append((slot, pid))
            else:
                self.slab.give_back(slot)
        self._lost_slots = kept

    def _dispatch(self) -> None:
        if self._plan is None:
            return
        with self._lock:
            tasks = self.dispatcher.assign(self.buffer.held, time.monotonic())
        for task in tasks:
            indices = self._plan.batch(task.seq)
            extra = {}
            info = self.dispatcher.producers.get(task.peer)
            if info is not None and info.shared:
                slot = self.slab.take()
                if slot is not None:  # none free (the loop holds many batches): this one goes over the socket
                    self._slot_of[task.task] = (slot, info.identity)
                    extra["slot"] = list(slot)
            ok = self._send(task.peer, [protocol.pack(
                protocol.TASK, session=self.session, task=task.task, epoch=self._epoch, seq=task.seq,
                indices=indices, on_error=self.config.on_error, **extra,
            )])
            if not ok:
                self._give_back_slot(task.task)  # the TASK never reached the producer
                self._lose(task.peer, "unreachable")

    def _send(self, peer: bytes, frames: list[Any]) -> bool:
        try:
            self._sock.send_multipart([peer, *frames], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (gone) or EAGAIN (not reading)
            return False


def _process_exists(pid: int) -> bool:
    """True while ``pid`` can still run (a zombie cannot write to memory any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
