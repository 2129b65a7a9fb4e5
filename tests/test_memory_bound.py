"""The memory bound, checked against an oracle the loader does not control.

``buffer_batches`` promises that batches buffered plus tasks in flight never exceed it. ``stats()`` reports
the very counters that enforce that limit, so a test that reads them cannot see a bug in them. Here the
producers are hand-made peers on raw DEALER sockets, and they count from the wire: TASKs received and not
yet answered, and BATCHes answered. The training loop counts the batches it was given. Every batch answered
and not yet given is still in the consumer's memory, so at every moment

    unanswered + (answered - given) <= buffer_batches
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import zmq

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.codec import encode_tree
from ferry.common.datasets import SyntheticDataset

from .helpers import assert_tree_equal, dealer, reference_batches, wait_for

FINGERPRINT = "wire-peers"


class WirePeers:
    """Hand-made producers, one DEALER each, served by one thread. A TASK is answered ``delay`` seconds after
    it arrived with the batch ``[indices as int64]``. ``silence(name)`` makes a peer stop answering and stop
    pinging, as a killed process would."""

    def __init__(self, endpoint: str, slots: dict[str, int], length: int, delay: float, heartbeat: float) -> None:
        self.length, self.delay, self.heartbeat = length, delay, heartbeat
        self.lock = threading.Lock()
        self.unanswered: dict[tuple[str, int], int] = {}  # (peer, task id) -> seq
        self.orphans: dict[tuple[str, int], int] = {}  # a silenced peer's tasks whose seq was not re-issued yet
        self.answered = 0
        self.rejects: list[str] = []
        self.received_by: dict[str, int] = {name: 0 for name in slots}
        self._silenced: set[str] = set()
        self._ctx = zmq.Context()
        self._socks = {name: dealer(self._ctx, endpoint) for name in slots}
        for pid, (name, sock) in enumerate(self._socks.items(), start=1):
            sock.send(protocol.pack(protocol.HELLO, producer=name, nonce=1, host="wire", pid=pid, slots=slots[name],
                                    dataset={"spec": "x", "len": length, "fingerprint": FINGERPRINT}))
        self._due: list[tuple[float, str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wire-peers")
        self._thread.start()

    def outstanding(self) -> int:
        """Batches the consumer may hold memory for, seen from the wire, minus what the loop was given."""
        with self.lock:
            return len(self.unanswered) + len(self.orphans) + self.answered

    def silence(self, name: str) -> None:
        with self.lock:
            self._silenced.add(name)
            for key in [k for k in self.unanswered if k[0] == name]:
                self.orphans[key] = self.unanswered.pop(key)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self._socks.values():
            sock.close(0)
        self._ctx.term()

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._socks.values():
            poller.register(sock, zmq.POLLIN)
        names = {sock: name for name, sock in self._socks.items()}
        next_ping = time.monotonic()
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(timeout=1):
                    name = names[sock]
                    frames = sock.recv_multipart()
                    if name in self._silenced:
                        continue
                    self._receive(name, protocol.parse_header(frames[0]))
                now = time.monotonic()
                self._answer_due(now)
                if now >= next_ping:
                    next_ping = now + self.heartbeat
                    for name, sock in self._socks.items():
                        if name not in self._silenced:
                            sock.send(protocol.pack(protocol.PING, load={}))
        except BaseException as exc:  # re-raised by the test
            self.failure = exc

    def _receive(self, name: str, header: dict[str, Any]) -> None:
        if header["type"] == protocol.REJECT:
            self.rejects.append(f"{name}: {header['reason']}")
        if header["type"] != protocol.TASK:
            return
        with self.lock:
            self.received_by[name] += 1
            self.unanswered[(name, header["task"])] = header["seq"]
            for key in [k for k, seq in self.orphans.items() if seq == header["seq"]]:
                del self.orphans[key]  # re-issued: it counts once, here
        self._due.append((time.monotonic() + self.delay, name, header))

    def _answer_due(self, now: float) -> None:
        keep = []
        for due, name, task in self._due:
            if name in self._silenced:
                continue
            if due > now:
                keep.append((due, name, task))
                continue
            spec, frames = encode_tree([np.asarray(task["indices"], dtype=np.int64)])
            with self.lock:
                del self.unanswered[(name, task["task"])]
                self.answered += 1
            self._socks[name].send_multipart([protocol.pack(
                protocol.BATCH, session=task["session"], task=task["task"], epoch=task["epoch"], seq=task["seq"],
                tree=spec, errors=[]), *frames])
        self._due = keep


def _run_epoch(loader: RemoteLoader, peers: WirePeers, capacity: int, step_s: float, expected: list,
               on_step=None) -> int:
    """Iterate one epoch with a training step of ``step_s``, checking the bound from the wire all the while.
    Returns the largest value the oracle saw."""
    given = 0
    worst = 0

    def check(where: str) -> None:
        nonlocal worst
        held = peers.outstanding() - given
        worst = max(worst, held)
        assert held <= capacity, (
            f"{where}: {held} batches unanswered or answered-and-not-given > buffer_batches={capacity} "
            f"(stats: {loader.stats()['buffered']} buffered, {loader.stats()['in_flight']} in flight)")

    for seq, batch in enumerate(loader):
        given += 1
        assert_tree_equal(batch, [expected[seq]], f"batch {seq}")
        if on_step is not None:
            on_step(seq)
        end = time.monotonic() + step_s
        check(f"after batch {seq}")
        while time.monotonic() < end:  # the training step: the peers keep working meanwhile
            check(f"during the step after batch {seq}")
            time.sleep(0.0005)
        assert peers.failure is None, peers.failure
    assert given == len(expected)
    return worst


def _expected(length: int, batch_size: int) -> list:
    return reference_batches(list(range(length)), batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                             shuffle=False, seed=0, epoch=0)


@pytest.mark.parametrize("capacity, slots", [(4, {"a": 3, "b": 3}), (1, {"a": 2, "b": 1})])
def test_wire_oracle_never_sees_more_than_buffer_batches(endpoint, capacity, slots):
    length, batch_size = 120, 4
    with RemoteLoader(endpoint=endpoint, batch_size=batch_size, buffer_batches=capacity, heartbeat=0.1,
                      timeout=20, dataset_len=length, log_every=None) as loader:
        peers = WirePeers(endpoint, slots, length, delay=0.001, heartbeat=0.05)
        try:
            wait_for(lambda: loader.stats()["producers"] == len(slots), 10, "the hand-made peers to join")
            worst = _run_epoch(loader, peers, capacity, step_s=0.01, expected=_expected(length, batch_size))
        finally:
            peers.close()
        assert not peers.rejects, peers.rejects
    # the loop is slow, so the window must have been full: the bound was exercised, not just respected
    assert worst == capacity, f"the oracle never saw a full window (max {worst} of {capacity})"


def test_wire_oracle_holds_across_a_silent_peer_and_the_reissue(endpoint):
    length, batch_size, capacity = 96, 4, 4
    with RemoteLoader(endpoint=endpoint, batch_size=batch_size, buffer_batches=capacity, heartbeat=0.1,
                      liveness=3, timeout=20, dataset_len=length, log_every=None) as loader:
        # "b" is slow: it is sure to hold tasks when it falls silent
        peers = WirePeers(endpoint, {"a": 2, "b": 2}, length, delay=0.02, heartbeat=0.05)
        try:
            wait_for(lambda: loader.stats()["producers"] == 2, 10, "the hand-made peers to join")

            def kill_b(seq: int) -> None:
                if seq == 3:
                    wait_for(lambda: any(k[0] == "b" for k in peers.unanswered), 10, "b to hold a task")
                    peers.silence("b")

            worst = _run_epoch(loader, peers, capacity, step_s=0.005, expected=_expected(length, batch_size),
                               on_step=kill_b)
            stats = loader.stats()
        finally:
            peers.close()
    assert stats["reissued"] >= 1 and stats["producers"] == 1, stats
    assert worst == capacity


@pytest.mark.usefixtures("needs_shared_memory")
def test_local_producers_slots_in_use_stay_within_the_readme_bound():
    """README: with shared memory, memory held is at most (buffer_batches + 4) x batch size. A loop that
    drops each batch before the next holds at most buffer_batches + 2 slots: the window, the batch in the
    loop's hands, and the one before it until the loop variable is rebound."""
    capacity = 3
    args = {"length": 160, "shape": [32, 32], "dtype": "uint8"}
    dataset = SyntheticDataset(**args)
    expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0, shuffle=False,
                                 seed=0, epoch=0)
    in_use: list[int] = []
    stop = threading.Event()
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, producer_slots=3, batch_size=4,
                      buffer_batches=capacity, heartbeat=0.1, timeout=30, log_every=None) as loader:

        def sample() -> None:
            while not stop.is_set():
                state = loader.stats()["shared_memory"]
                in_use.append(state["slots"] - state["free"] - state["lost"])
                time.sleep(0.0005)

        sampler = threading.Thread(target=sample, name="slot-sampler")
        sampler.start()
        try:
            for seq, batch in enumerate(loader):
                assert_tree_equal(batch, expected[seq], f"batch {seq}")
                time.sleep(0.01)  # the training step
        finally:
            stop.set()
            sampler.join(10)
        slots = loader.stats()["shared_memory"]["slots"]
        assert loader.stats()["shared_batches"] == len(expected)
    assert slots <= capacity + 4, f"the slab has {slots} slots, more than the README's buffer_batches + 4"
    assert len(in_use) > 100
    assert max(in_use) <= capacity + 2, f"{max(in_use)} slots in use at once, more than buffer_batches + 2"
    assert max(in_use) >= capacity, "the window never filled: the bound was not exercised"
