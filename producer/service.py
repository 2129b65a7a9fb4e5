"""The producer service: one poll loop that owns every DEALER socket and applies what the connections decide.

Each ``--connect`` endpoint is a :class:`~ferry.producer.links.Link`: one DEALER socket and one
:class:`~ferry.producer.connection.Connection`, the pure state machine of that consumer connection (its
lifecycle is drawn there). The loop reads the clock, feeds the machine its events (messages, ticks, the
fate of a send, the socket becoming writable while a HELLO waits for a connection, stop) and carries out
the actions it returns: send HELLO / PING / BYE, run a TASK, rebuild
the socket, log.

Threads: the main loop (this module), plus the batcher's pools (:mod:`ferry.producer.batcher`). Shutdown order,
on SIGTERM / SIGINT / ``stop()``: the main loop leaves its poll, says BYE on every serving connection,
closes sockets with LINGER=0 (PRODUCER_BYE_LINGER_MS where a BYE was queued: the frames still queued are dropped,
which hands their pooled buffers back), stops the batcher (waits for running samples, cancels queued
ones), then terminates its own zmq context.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket as pysocket
import time
import uuid
from typing import Any

import zmq

from ferry.common import protocol
from ferry.common.constants import (MAX_DATASET_LEN, PRODUCER_BYE_LINGER_MS, HEARTBEAT_S, POLL_HEARTBEAT_FRACTION,
                                    POLL_MIN_MS, RECEIVE_BURST)
from ferry.common.datasets import dataset_fingerprint
from ferry.common.errors import ProtocolError
from ferry.common.ratelimit import RateLimitedLog
from ferry.common.shardplan import announced_shard_lengths, is_sharded, shard_names
from ferry.common.streamplan import is_iterable, iterable_fields, iterable_len
from ferry.common.waker import Waker

from ferry.producer.batcher import Batcher, Job, Outcome
from ferry.producer.buffers import tracked
from ferry.producer.compressing import FrameCompressor, LinkCodec
from ferry.producer.config import ProducerConfig
from ferry.producer.connection import (
    EXIT_OK, Action, CheckAddress, Connection, FailTask, Log, Rebuild, RunTask, SendBye, SendHello, SendPing, Stale,
    exit_code,
)
from ferry.producer.links import Link, announced_frame_bytes
from ferry.producer.resolver import AddressResolver

log = logging.getLogger("ferry.producer")


class Producer:
    """Serves a dataset to one or more consumers until stopped."""

    def __init__(self, config: ProducerConfig, dataset: Any) -> None:
        self.config = config
        self.dataset = dataset
        self.sharded = is_sharded(dataset)  # a stream of shards: "len" is the shard count (producer/shards.py)
        self.iterable = is_iterable(dataset)  # an IterableDataset: "len" is len(dataset) or 0 (producer/streams.py)
        self.dataset_len = (len(shard_names(dataset)) if self.sharded else (iterable_len(dataset) or 0)
                            if self.iterable else len(dataset))
        self.iterable_fields = iterable_fields(dataset) if self.iterable else {}  # told in every HELLO
        # each shard's samples, told in every HELLO: how a loader that does not hold the dataset knows len()
        self.shard_lengths = announced_shard_lengths(dataset) if self.sharded else None
        self.fingerprint = dataset_fingerprint(dataset)
        self.producer_id = uuid.uuid4().hex[:12]
        self.name = f"{pysocket.gethostname()}:{os.getpid()}"
        self._stop_requested = False  # a plain flag: stop() runs in signal handlers, which must take no lock
        self._waker = Waker()
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._links: dict[int, Link] = {}
        self._resolver = AddressResolver(self._waker)  # DNS lookups off the main loop (producer/resolver.py)
        self._slab = self._map_slab(config.shared_memory)
        # compresses frames for links that use a codec, on its own threads (common/compression.py)
        self._compressor = FrameCompressor(workers=min(config.threads, os.cpu_count() or 1))
        self._batcher = Batcher(
            dataset,
            collate_fn=config.collate,
            threads=config.threads,
            batch_workers=config.slots * max(1, len(config.endpoints)),
            done=self._done,
            waker=self._waker,
            compressor=self._compressor,
        )
        self.batches_sent = 0
        self.bytes_sent = 0
        self.shared_batches = 0  # batches written into the consumer's shared-memory slab
        self.invalid_messages = 0
        self.stale_messages = 0
        self._invalid_log = RateLimitedLog(log, suppressed="%d more invalid messages were dropped without a log line")
        self._keys = itertools.count()
        self._poller = zmq.Poller()
        self._metrics = None
        try:
            for endpoint in config.endpoints:
                link = self._connect(endpoint)
                self._links[link.key] = link
                self._check_address(link)  # known before the first "no consumer answers" warning
            if config.metrics_port:
                from ferry.common.metrics import MetricsServer

                self._metrics = MetricsServer(config.metrics_port, self.figures, "ferry_producer")
        except BaseException:
            self._close()
            raise

    # --- public -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the main loop to finish. Safe from any thread and from a signal handler.

        It takes no lock of its own: a handler runs on the main thread between two bytecodes, possibly inside
        a lock the main thread holds, and two SIGTERMs in a row (the parent's death signal, then the loader's
        terminate) once deadlocked a producer inside threading.Event.set. The waker's lock is re-entrant for
        the same reason."""
        self._stop_requested = True
        self._waker.wake()

    def run(self) -> int:
        """Serve until stopped or permanently rejected everywhere. Returns the process exit code."""
        cfg = self.config
        log.info(
            "ferry producer %s (id %s) serving %s: %d samples, fingerprint %s, %d threads, %d slots -> %s",
            self.name, self.producer_id, cfg.dataset_label, self.dataset_len, self.fingerprint,
            cfg.threads, cfg.slots, ", ".join(cfg.endpoints),
        )
        poller = self._poller
        poller.register(self._waker.fileno(), zmq.POLLIN)
        for link in self._links.values():
            link.register()
        code = EXIT_OK
        try:
            while not self._stop_requested:
                rejected = exit_code(link.conn for link in self._links.values())
                if rejected is not None:
                    log.error("every consumer rejected this producer permanently; exiting")
                    code = rejected
                    break
                now = time.monotonic()  # ticks before the poll: the first HELLO goes out at once
                for link in self._links.values():
                    self._apply(link, link.conn.tick(now))
                    link.watch_writable()
                events = dict(poller.poll(timeout=self._poll_timeout_ms()))
                if self._waker.fileno() in events:
                    self._waker.drain()
                for link in self._links.values():
                    ready = events.get(link.sock, 0)
                    if ready & zmq.POLLIN:
                        self._receive(link)
                    if ready & zmq.POLLOUT:  # a connection came up while a HELLO waited for one
                        self._apply(link, link.conn.writable(time.monotonic()))
                    if link.auth_denials(events):  # with CURVE: the consumer refused our key
                        self._apply(link, link.conn.auth_denied(time.monotonic()))
                self._send_outcomes()
                self._address_results()
            for link in self._links.values():
                self._apply(link, link.conn.stop())
        finally:
            self._close()
        log.info("ferry producer %s stopped after %d batches", self.name, self.batches_sent)
        return code

    # --- applying the connections' decisions ---------------------------------------------------------
    def _apply(self, link: Link, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendHello):
                if not self._send(link, [self._hello(action.nonce)]):
                    self._apply(link, link.conn.hello_unsent(time.monotonic()))
            elif isinstance(action, SendPing):
                self._send(link, [protocol.pack(protocol.PING, load={
                    "pending": action.pending, "sent": self.batches_sent,
                    "compression": link.compression.last or "off"})])
            elif isinstance(action, RunTask):
                self._run_task(link, action.header)
            elif isinstance(action, FailTask):
                self._send(link, [_index_fail(action)])
            elif isinstance(action, CheckAddress):
                self._check_address(link)
            elif isinstance(action, Stale):
                self.stale_messages += 1
            elif isinstance(action, Rebuild):
                link.rebuild()
            elif isinstance(action, SendBye):
                link.said_bye = self._send(link, [protocol.pack(protocol.BYE)])
            elif isinstance(action, Log):
                log.log(action.level, "%s", action.message)

    def _run_task(self, link: Link, header: dict[str, Any]) -> None:
        slot = None
        if "slot" in header and self._slab is not None:  # a consumer without our slab never sends one
            try:
                slot = self._slab.writer(tuple(header["slot"]))
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        link.conn.task_started()
        self._batcher.submit(
            Job(link.key, header["session"], header["task"], header["epoch"], header["seq"], header["indices"],
                header["on_error"], slot, header.get("seed", 0), shard=header.get("shard"),
                streams=header.get("streams"),
                compress=link.compression.task(header), frame_bytes=link.frame_bytes,
                max_batch_bytes=link.max_batch_bytes)
        )

    # --- sockets ------------------------------------------------------------------------------------
    def _connect(self, endpoint: str) -> Link:
        cfg = self.config
        conn = Connection(endpoint, now=time.monotonic(), heartbeat=cfg.heartbeat, liveness=cfg.liveness,
                          unreachable_warning_s=cfg.unreachable_warning_s,
                          # a stream task's indices name its stream, which the stream runner checks
                          dataset_len=MAX_DATASET_LEN if self.iterable else self.dataset_len)
        link = Link(key=next(self._keys), endpoint=endpoint, conn=conn, ctx=self._ctx, poller=self._poller,
                    compression=LinkCodec(endpoint, cfg.compression),
                    curve=cfg.curve)
        link.open()
        return link

    def _check_address(self, link: Link) -> None:
        self._resolver.check(link.key, link.endpoint)

    def _address_results(self) -> None:
        for key, problem in self._resolver.results():
            self._links[key].conn.address_checked(problem)

    def _send(self, link: Link, frames: list[Any]) -> bool:
        try:
            link.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False  # not connected, or the consumer stopped reading: it will re-issue
        link.conn.sent(time.monotonic())
        return True

    def figures(self) -> dict[str, Any]:
        """What the metrics endpoint exports (read from its thread; plain int reads)."""
        return {
            "batches_sent": self.batches_sent, "bytes_sent": self.bytes_sent, "shared_batches": self.shared_batches,
            "invalid_messages": self.invalid_messages, "stale_messages": self.stale_messages,
            "pending": self._batcher.pending,
            "consumers": sum(1 for link in list(self._links.values()) if link.conn.serving),
        }

    def _close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        # sockets first: closing them drops the frames still queued to a consumer (after a BYE's bounded
        # linger), which hands their pooled buffers back. A batch job waiting for such a buffer would
        # otherwise hold the batcher's shutdown for BUFFER_ACQUIRE_TIMEOUT_S. Batch jobs never touch sockets.
        for link in self._links.values():
            link.close(linger=PRODUCER_BYE_LINGER_MS if link.said_bye else 0)  # let a BYE leave, bounded
        self._batcher.close()
        self._compressor.close()
        self._resolver.close()  # ends after the lookup in progress, if any (not waited for)
        self._ctx.term()
        self._waker.close()

    # --- receiving ------------------------------------------------------------------------------------
    def _receive(self, link: Link) -> None:
        for _ in range(RECEIVE_BURST):  # bounded burst, then let the loop breathe
            try:
                frames = link.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = protocol.parse_header(frames[0])
                actions = link.conn.receive(header, len(frames), time.monotonic())
                if header["type"] == protocol.WELCOME:  # accepted: the codecs the consumer has, its frame bound
                    link.compression.welcome(header)
                    link.frame_bytes = announced_frame_bytes(header)
                    link.max_batch_bytes = header.get("max_batch_bytes")
                self._apply(link, actions)
            except ProtocolError as exc:
                self.invalid_messages += 1
                self._invalid_log.warning("invalid message #%d from %s dropped: %s", self.invalid_messages,
                                          link.endpoint, exc)

    # --- sending ------------------------------------------------------------------------------------
    def _send_outcomes(self) -> None:
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return
            link = self._links[outcome.job.conn_key]
            if not link.conn.owns(outcome.job.session):
                self._release(outcome, None)
                continue  # the session it belonged to is gone
            link.conn.task_finished()
            frames, tracker = outcome.frames, None
            count = outcome.buffer_frames if outcome.buffer is not None else 0
            if count:  # the pooled buffer's views: it goes back to the pool once ZeroMQ has sent them
                frames, tracker = tracked(frames, count)
            sent = self._send(link, frames)
            del frames
            self._release(outcome, tracker if sent else None)
            if sent and not outcome.failed:
                self.batches_sent += 1
                self.bytes_sent += sum(len(f) for f in outcome.frames[1:])
                if outcome.job.slot is not None and outcome.job.slot.used:
                    self.shared_batches += 1
                    self.bytes_sent += outcome.job.slot.used

    def _release(self, outcome: Outcome, tracker: Any) -> None:
        if outcome.buffer is not None:
            self._batcher.pool.release(outcome.buffer, tracker)

    def _hello(self, nonce: int) -> bytes:
        return protocol.pack(
            protocol.HELLO,
            producer=self.producer_id,
            nonce=nonce,
            host=pysocket.gethostname(),
            pid=os.getpid(),
            slots=self.config.slots,
            dataset={"spec": self.config.dataset_label, "len": self.dataset_len, "fingerprint": self.fingerprint,
                     **({"sharded": True} if self.sharded else {}),
                     **({"shard_lens": self.shard_lengths} if self.shard_lengths is not None else {}),
                     **self.iterable_fields},
            **({"shm": self.config.shared_memory[1]} if self._slab is not None else {}),
            **({"worker": [self.config.worker_id, self.config.num_workers]} if self.iterable else {}),
        )

    @staticmethod
    def _map_slab(shared_memory: tuple[str, str] | None) -> Any:
        if shared_memory is None:
            return None
        from ferry.common.shm import SlabMapping

        try:
            return SlabMapping(shared_memory[0])
        except (OSError, ValueError) as exc:  # still correct without it: batches go over the socket
            log.warning("cannot map the consumer's shared memory %s (%s); sending batches over the socket",
                        shared_memory[0], exc)
            return None

    def _poll_timeout_ms(self) -> int:
        beat = min((link.conn.heartbeat for link in self._links.values()), default=HEARTBEAT_S)
        return max(POLL_MIN_MS, int(beat * POLL_HEARTBEAT_FRACTION * 1000))



def _index_fail(action: FailTask) -> bytes:
    """The FAIL answering a TASK that names a sample outside the dataset (the consumer raises
    SampleIndexError for it, whatever its on_error)."""
    h = action.header
    error = {"index": action.index, "exc_type": "SampleIndexError", "message": action.message, "traceback": ""}
    return protocol.pack(protocol.FAIL, session=h["session"], task=h["task"], epoch=h["epoch"], seq=h["seq"],
                         errors=[error])
