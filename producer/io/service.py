"""The producer service: one poll loop that owns every DEALER socket and applies what the state machines decide.

Each consumer connection is a :class:`~ferry.producer.io.links.Link`: a DEALER socket and a
:class:`~ferry.producer.core.connection.Connection`, the pure state machine of that connection (its lifecycle is
drawn there). Which connections exist is decided by :class:`~ferry.producer.core.discovery.Discovery` (one per
endpoint, or per address of an endpoint's name, kept fresh): :mod:`ferry.producer.io.linkset`. The loop reads the
clock, feeds the machines their events (messages, ticks, lookups, the fate of a send, the socket becoming
writable while a HELLO waits for a connection, stop) and carries out the actions they return: send HELLO /
PING / BYE (:mod:`ferry.producer.io.outbox`), run a TASK, open, rebuild or close a connection, log. Each turn it
also writes the status that the engine's probes read (:mod:`ferry.producer.status`).

Threads: the main loop (this module), the batcher's pools (:mod:`ferry.producer.loading.batcher`), the compression pool,
``ferry-open`` (named datasets, :mod:`ferry.producer.loading.pool`), ``ferry-resolve`` (DNS, :mod:`ferry.producer.io.resolver`)
and, with ``--metrics-port``, ``ferry-metrics``.
Shutdown order, on SIGTERM / SIGINT / ``stop()``: the main loop leaves its poll, marks its status ``stopping``,
says BYE on every serving connection (the consumer re-issues what it held here, charging no attempt), closes
the sockets with LINGER=0 (PRODUCER_BYE_LINGER_MS where a BYE was queued: the frames still queued are dropped,
which hands their pooled buffers back), stops the batcher (queued samples are cancelled; running ones get
``--drain-timeout`` seconds, then the process exits without them:
:func:`ferry.producer.exits.exit_past_lingering_threads`), terminates its zmq context, removes its status file.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket as pysocket
import threading
import time
import uuid
from typing import Any

import zmq

from ferry.common.constants import HEARTBEAT_S, POLL_HEARTBEAT_FRACTION, POLL_MIN_MS, RECEIVE_BURST
from ferry.common import protocol
from ferry.common.errors import ProtocolError
from ferry.common.ratelimit import RateLimitedLog
from ferry.common.waker import Waker

from ferry.producer.loading.batcher import Batcher, Job, Outcome
from ferry.producer.loading.pool import DatasetPool
from ferry.producer.core.sharing import Sharing
from ferry.producer.loading.compressing import FrameCompressor
from ferry.producer.config import ProducerConfig
from ferry.producer.core.connection import (
    EXIT_OK, Action, AnswerBye, CheckAddress, FailTask, Log, OpenDataset, Rebuild, RunTask, SendBye, SendHello,
    SendPing, Stale, exit_code,
)
from ferry.producer.exits import EXIT_STUCK
from ferry.producer.io.links import Link, announced_frame_bytes
from ferry.producer.io.linkset import LinkSet
from ferry.producer.logs import fields
from ferry.producer.io.outbox import Outbox, hello_fields
from ferry.producer.health import Health
from ferry.producer.status import PROBES, SERVING, STARTING, STOPPING
from ferry.producer.core.stuck import StuckLoads

log = logging.getLogger("ferry.producer")

#: What a HELLO announces of a producer with no dataset of its own, on a connection no consumer named one for
#: (common/pool.py): an empty spec.
NO_DATASET = {"spec": "", "len": 0, "fingerprint": ""}


class Producer:
    """Serves a dataset to one or more consumers until stopped."""

    def __init__(self, config: ProducerConfig, dataset: Any) -> None:
        """``dataset``: the producer's own (``--dataset``), opened; None for a pool that serves only the datasets its
        consumers name (producer/loading/pool.py)."""
        self.config = config
        self.producer_id = uuid.uuid4().hex[:12]
        self.name = f"{pysocket.gethostname()}:{os.getpid()}"
        self._stop_requested = False  # a plain flag: stop() runs in signal handlers, which must take no lock
        self._waker = Waker()
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()
        self._metrics = None
        self._health = Health(config.status_file, config.stuck_after, self.figures)  # status file and probes
        # the consumer connections, as the endpoints and what their names resolve to call for (producer/io/linkset.py);
        # each checks TASK indices against the dataset it is bound to (its own, until a consumer names another)
        self._links = LinkSet(config, ctx=self._ctx, poller=self._poller, waker=self._waker,
                              say_bye=lambda link: self._apply(link, link.conn.stop()),
                              bind=lambda link, opened: self._sharing.bind_link(link, opened))
        self._slab = self._map_slab(config.shared_memory)
        # compresses frames for links that use a codec, on its own threads (common/compression.py)
        self._compressor = FrameCompressor(workers=min(config.pool_threads, os.cpu_count() or 1))
        # one batch worker per slot of every connection there may be (threads start only when work needs them);
        # a batch buffer for every task a consumer may have given (a sent batch's buffer is back once libzmq is done)
        connections = max(1, self._links.capacity)
        workers = config.slots * connections
        datasets = DatasetPool(
            dataset, label=config.dataset_label, allowed=config.allow_dataset, threads=config.threads,
            buffers=(config.slots + config.tasks_ahead) * connections + 2, own_collate=config.collate,
            wake=self._waker.wake,
            seed_per_sample=config.seed_per_sample,
            canaries=not config.exit_with_parent,  # a loader's local producers are its own copies: none to check
            make_batcher=lambda ds, collate, shared: Batcher(
                ds, collate_fn=collate, threads=config.pool_threads, batch_workers=workers, done=self._done,
                waker=self._waker, compressor=self._compressor, shared=shared,
                seed_per_sample=config.seed_per_sample))
        own = datasets.own
        # the datasets its consumers name, and a TASK's turn among theirs: at most --slots run at once (sharing.py)
        self._sharing = Sharing(datasets, limit=config.slots)
        self._outbox = Outbox(hello_fields(producer_id=self.producer_id, slots=config.slots, ahead=config.tasks_ahead,
                                           dataset=own.announce if own is not None else dict(NO_DATASET),
                                           shm_token=config.shared_memory[1] if self._slab is not None else None,
                                           worker=[config.worker_id, config.num_workers]
                                           if own is not None and own.iterable else None,
                                           serial=self._serial(own)),
                              datasets.buffers)
        # loads given up on by their consumers that fill every loading thread: no HELLO until one returns (stuck.py)
        self._stuck = StuckLoads(config.slots, config.unreachable_warning_s, config.exit_when_stuck)
        self.invalid_messages = 0
        self.stale_messages = 0
        self._invalid_log = RateLimitedLog(log, suppressed="%d more invalid messages were dropped without a log line")
        try:
            self._health.file.write(STARTING, time.monotonic())  # a path that cannot be written fails here, at start
            self._links.start()
            if config.metrics_port:
                from ferry.common.metrics import MetricsServer

                self._metrics = MetricsServer(config.metrics_port, self.figures, "ferry_producer", answers={
                    f"/{kind}z": functools.partial(self.answer, kind) for kind in PROBES})  # /livez, /readyz ...
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

    def _serial(self, served: Any) -> bool:
        """Its own dataset loads one sample at a time by default: a map-style class of the user's, no --threads."""
        return served is not None and served.batcher.serial

    def run(self) -> int:
        """Serve until stopped or permanently rejected everywhere. Returns the process exit code."""
        cfg = self.config
        served = self._sharing.datasets.own
        own = served.announce if served is not None else NO_DATASET
        allowed = ", ".join(cfg.allow_dataset) or "none"
        one_at_a_time = self._serial(served)
        threads = 1 if one_at_a_time else cfg.pool_threads
        serial = " (a dataset class of your own loads one sample at a time: --threads N if it is thread-safe)" \
            if one_at_a_time else ""
        log.info("ferry producer %s (id %s) serving %s: %d samples, fingerprint %s, loading threads %d%s, %d slots "
                 "-> %s; datasets consumers may name: the built-ins and %s",
                 self.name, self.producer_id, cfg.dataset_label or "no dataset of its own", own["len"],
                 own["fingerprint"] or "-", threads, serial, cfg.slots, ", ".join(cfg.endpoints), allowed,
                 extra=fields(event="start", producer=self.name, producer_id=self.producer_id,
                              dataset=cfg.dataset_label, samples=own["len"], fingerprint=own["fingerprint"],
                              threads=threads, slots=cfg.slots, endpoints=list(cfg.endpoints),
                              allow_dataset=list(cfg.allow_dataset)))
        poller = self._poller
        poller.register(self._waker.fileno(), zmq.POLLIN)
        code = EXIT_OK
        try:
            while not self._stop_requested:
                rejected = exit_code(link.conn for link in self._links) if self._links.complete else None
                if rejected is not None:
                    log.error("every consumer rejected this producer permanently; exiting",
                              extra=fields(event="rejected_everywhere", exit_code=rejected))
                    code = rejected
                    break
                now = self._health.last_turn = time.monotonic()  # ticks before the poll: the first HELLO goes at once
                self._links.tick(now)
                # a hold acts on greeting connections only: while every one serves, the main loop does not look
                if self._stuck.held or not all(link.conn.serving for link in self._links):
                    serving = any(link.conn.serving for link in self._links)
                    for action in self._stuck.update(self._sharing.orphans(self._links.get), now, serving):
                        log.log(action.level, "%s", action.message, extra=fields(**action.fields))
                    if self._stuck.expired:  # held for --exit-when-stuck: a fresh process takes this one's place
                        code = EXIT_STUCK
                        break
                for link in self._links:
                    if self._stuck.held and not link.conn.serving:
                        link.conn.hold(now)  # no HELLO: it would only be given tasks that wait behind the stuck loads
                    else:
                        self._apply(link, link.conn.tick(now))
                    link.watch_writable()  # also while held: a POLLOUT left armed would spin the poll
                if self._health.file.due(now, SERVING):
                    self._health.write(SERVING, now)
                events = dict(poller.poll(timeout=self._poll_timeout_ms(now)))
                if self._waker.fileno() in events:
                    self._waker.drain()
                for link in self._links:
                    ready = events.get(link.sock, 0)
                    if ready & zmq.POLLIN:
                        self._receive(link)
                    if ready & zmq.POLLOUT:  # a connection came up while a HELLO waited for one
                        self._apply(link, link.conn.writable(time.monotonic()))
                    if link.auth_denials(events):  # with CURVE: the consumer refused our key
                        self._apply(link, link.conn.auth_denied(time.monotonic()))
                for link, actions in self._sharing.opened(self._links, time.monotonic()):  # named datasets opened
                    self._apply(link, actions)
                while (outcome := self._next_outcome()) is not None:
                    self._sharing.finished(outcome.job, time.monotonic())  # its worker is free: the next one's turn
                    self._outbox.deliver(outcome, self._links.get(outcome.job.conn_key), time.monotonic())
                self._sharing.start(self._links.get, time.monotonic())
                self._links.answers()
            self._health.write(STOPPING, time.monotonic())
            for link in self._links:
                self._apply(link, link.conn.stop())
        finally:
            self._close()
        log.info("ferry producer %s stopped after %d batches", self.name, self._outbox.batches_sent,
                 extra=fields(event="stop", batches_sent=self._outbox.batches_sent, exit_code=code))
        return code

    # --- applying the machines' decisions ----------------------------------------------------------------
    def _apply(self, link: Link, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendHello):
                if not self._outbox.hello(link, action.nonce, time.monotonic()):
                    self._apply(link, link.conn.hello_unsent(time.monotonic()))
            elif isinstance(action, SendPing):
                self._outbox.ping(link, action.pending, time.monotonic())
            elif isinstance(action, RunTask):
                self._run_task(link, action.header)
            elif isinstance(action, FailTask):
                self._outbox.index_fail(link, action, time.monotonic())
            elif isinstance(action, CheckAddress):
                self._links.check(link)
            elif isinstance(action, Stale):
                self.stale_messages += 1
            elif isinstance(action, OpenDataset):
                self._apply(link, self._sharing.bind_dataset(link, action, time.monotonic()))
            elif isinstance(action, Rebuild):
                link.rebuild()
            elif isinstance(action, SendBye):
                self._outbox.bye(link, time.monotonic())
            elif isinstance(action, AnswerBye):
                self._outbox.answer_bye(link)
            elif isinstance(action, Log):
                log.log(action.level, "%s", action.message,
                        extra={"fields": {"endpoint": link.conn.endpoint, **action.fields}})

    def _run_task(self, link: Link, header: dict[str, Any]) -> None:
        slot = None
        if "slot" in header and self._slab is not None:  # a consumer without our slab never sends one
            try:
                slot = self._slab.writer(tuple(header["slot"]))
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        link.conn.task_started()
        job = Job(link.key, header["session"], header["task"], header["epoch"], header["seq"], header["indices"],
                  header["on_error"], slot, header.get("seed", 0), shard=header.get("shard"),
                  streams=header.get("streams"),
                  compress=link.compression.task(header), frame_bytes=link.frame_bytes,
                  max_batch_bytes=link.max_batch_bytes, unbatched=header.get("unbatched"), pickle_ok=link.pickle_ok)
        self._sharing.submit(link, job, time.monotonic())  # its turn comes by the consumers' weights
        self._sharing.start(self._links.get, time.monotonic())

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
                    link.pickle_ok = header.get("pickle") is True
                    link.weight = header.get("weight", 1.0)  # its share against the other consumers' (fairshare.py)
                elif header["type"] == protocol.PING and link.conn.serving:  # its demand and stall (sharing.py)
                    link.load = header["load"]
                self._apply(link, actions)
            except ProtocolError as exc:
                self.invalid_messages += 1
                self._apply(link, link.conn.invalid(time.monotonic()))  # too many: that consumer's session goes
                self._invalid_log.warning("invalid message #%d from %s dropped: %s", self.invalid_messages,
                                          link.conn.endpoint, exc)

    def _next_outcome(self) -> Outcome | None:
        try:
            return self._done.get_nowait()
        except queue.Empty:
            return None

    # --- figures, status, probes --------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        """What the metrics endpoint exports (read from its thread; plain int reads)."""
        return {
            "batches_sent": self._outbox.batches_sent, "bytes_sent": self._outbox.bytes_sent,
            "shared_batches": self._outbox.shared_batches, "invalid_messages": self.invalid_messages,
            "stale_messages": self.stale_messages, "pending": self._sharing.pending, **self._links.describe(),
            **self._sharing.figures(self._links),
        }

    def answer(self, probe: str) -> tuple[bool, str]:
        """The answer to ``probe`` (producer/status.py) from the last turn of the main loop. Any thread may ask: the
        metrics server's /livez, /readyz and /servingz do."""
        return self._health.answer(probe, stopping=self._stop_requested)

    def _poll_timeout_ms(self, now: float) -> int:
        beat = min((link.conn.heartbeat for link in self._links), default=HEARTBEAT_S)
        wait = min(beat * POLL_HEARTBEAT_FRACTION, self._links.discovery.wait_s(now),
                   self._health.wait_s())
        return max(POLL_MIN_MS, int(wait * 1000))

    # --- shutdown -------------------------------------------------------------------------------------
    def _close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        # sockets first: closing them drops the frames still queued to a consumer (after a BYE's bounded
        # linger), which hands their pooled buffers back. A batch job waiting for such a buffer would
        # otherwise hold the batcher's shutdown for BUFFER_ACQUIRE_TIMEOUT_S. Batch jobs never touch sockets.
        self._links.close()  # BYEs leave within a bounded linger; the resolver thread ends (not waited for)
        self._drain()
        self._compressor.close()
        self._ctx.term()
        self._waker.close()
        self._health.file.remove()

    def _drain(self) -> None:
        """Stop the batcher: queued work is cancelled, running samples get ``drain_timeout`` seconds. Their tasks
        went back to the consumers with the BYE, so nothing waits for them: past the bound the process exits
        without them (exit_past_lingering_threads), and the abandoned threads go with it. A producer leaving
        for stuck loads (producer/core/stuck.py) waits for none: what runs is what holds it."""
        pending = self._sharing.pending
        closer = threading.Thread(target=self._sharing.close, name="ferry-drain", daemon=True)
        closer.start()
        if self._stuck.expired:
            return
        closer.join(self.config.drain_timeout)
        if closer.is_alive():  # a local producer's loader is stopping it: news, not an alarm
            log.log(logging.INFO if self.config.exit_with_parent else logging.WARNING,
                    "%d batches were still loading %g s after the stop (--drain-timeout); exiting without them "
                    "(their consumers re-issue them)", self._sharing.pending, self.config.drain_timeout,
                    extra=fields(event="drain_timeout", pending=self._sharing.pending, pending_at_stop=pending,
                                 drain_timeout_s=self.config.drain_timeout))

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
