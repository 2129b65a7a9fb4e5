"""Hostile input: at least 10,000 random and mutated messages hit the consumer's socket and the
producers' sockets while real producers serve a training loop. The loop still gets exact batches,
invalid messages are counted, no thread or process dies, and the RSS of the consumer and of every producer,
sampled all through the attack, stays bounded.

The attack's seed is printed; ``FERRY_FUZZ_SEED=<seed> python -m pytest tests/test_fuzz.py`` replays it."""

import multiprocessing
import os
import random
import threading
import time

import pytest
import zmq
from hypothesis import given, settings, strategies as st

from ferry.common import protocol
from ferry.common.codec import decode_tree
from ferry.common.constants import MAX_HEADER_BYTES, PROTOCOL_VERSION
from ferry.common.datasets import dataset_fingerprint
from ferry.common.errors import ProtocolError
from ferry import RemoteLoader
from tests.datasets import PairDataset

from .fuzzing import bad_tree, hostile_frames, mutate, pack
from .helpers import (
    assert_tree_equal, consumer_threads_alive, dealer, free_port, hello, reference_batches, wait_for, welcome_fields,
)

MESSAGES = 10_000
# the most an attack may take: 10,000 messages each way take 20-60 s alone, over 120 s with the 2 cores busy
ATTACK_S = 300
RSS_BOUND_MB = 64  # what the consumer process may grow by while it is fuzzed (about 8 MB measured)
# its peak during the attack: the end's bound plus room for hostile messages (up to max_batch_bytes = 1 MiB
# each) queued in libzmq at once (25 to 50 MB measured on the reference machine)
RSS_PEAK_BOUND_MB = 128
PRODUCER_RSS_BOUND_MB = 64  # what each producer may grow by while it is fuzzed


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def fuzz_seed() -> int:
    """The attack's seed: FERRY_FUZZ_SEED if set (to replay a failure), else a fresh one. Printed either way."""
    value = os.environ.get("FERRY_FUZZ_SEED")
    seed = int(value) if value else random.randrange(1 << 30)
    print(f"fuzz seed {seed} (replay: FERRY_FUZZ_SEED={seed})")
    return seed


class RssSampler:
    """Samples the RSS of some processes every ``interval`` seconds, in a thread, until ``stop``; keeps the peak
    of each. A spike during an attack that is gone by its end still counts."""

    def __init__(self, pids: dict[str, int | str], interval: float = 0.01) -> None:
        self.pids, self.interval = pids, interval
        self.peak = {name: rss_mb(pid) for name, pid in pids.items()}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name, pid in self.pids.items():
                try:
                    self.peak[name] = max(self.peak[name], rss_mb(pid))
                except FileNotFoundError:  # a producer that died; asserted on by the test
                    pass
            self.samples += 1

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        return self.peak


def consumer_templates(fingerprint_len: int):
    return [
        dict(v=PROTOCOL_VERSION, type="HELLO", producer="fz", nonce=1, host="fuzz", pid=1, slots=2,
             dataset={"spec": "x", "len": fingerprint_len + 1, "fingerprint": "wrong"}),
        dict(v=PROTOCOL_VERSION, type="PING", load={}),
        dict(v=PROTOCOL_VERSION, type="BYE"),
        dict(v=PROTOCOL_VERSION, type="BATCH", session=1, task=1, epoch=0, seq=0, tree=None, errors=[]),
        dict(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0,
             errors=[{"index": 0, "exc_type": "E", "message": "m", "traceback": "t"}]),
        dict(v=PROTOCOL_VERSION, type="TASK", session=1, task=1, epoch=0, seq=0, indices=[0], on_error="raise"),
    ]


def producer_templates(session: int):
    return [
        dict(v=PROTOCOL_VERSION, type="TASK", session=session, task=7, epoch=0, seq=0, indices=[1, 2],
             on_error="raise"),
        dict(v=PROTOCOL_VERSION, type="TASK", session=session, task=8, epoch=0, seq=0, indices=[-1],
             on_error="raise"),
        dict(v=PROTOCOL_VERSION, type="TASK", session=session, task=9, epoch=0, seq=0, indices=[10 ** 9],
             on_error="skip"),
        dict(v=PROTOCOL_VERSION, type="TASK", session=session, task=9, epoch=0, seq=0,
             indices=list(range(70_000)), on_error="skip"),
        dict(v=PROTOCOL_VERSION, type="WELCOME", session=session, heartbeat=0.2, nonce=5, **welcome_fields()),
        dict(v=PROTOCOL_VERSION, type="PING", load={}),
        dict(v=PROTOCOL_VERSION, type="BATCH", session=session, task=1, epoch=0, seq=0, tree=None, errors=[]),
    ]


def fuzz_consumer(endpoint: str, seed: int, count: int, length: int, stop: threading.Event, sent: list) -> None:
    rng = random.Random(seed)
    ctx = zmq.Context()
    templates = consumer_templates(length)
    socks = []
    try:
        for _ in range(4):  # the last one alone sends frames over the size limit (libzmq drops its link)
            sock = dealer(ctx, endpoint)
            sock.setsockopt(zmq.SNDTIMEO, 2000)
            socks.append(sock)
        # an insider: registers with the right fingerprint, then answers every task with garbage
        insider = dealer(ctx, endpoint)
        socks.append(insider)
        insider.send(hello("insider", slots=2, length=length, fingerprint=fingerprint_len_print(length)))
        for i in range(count):
            if stop.is_set():
                break
            frames = hostile_frames(rng, templates, max_frame=1 << 20)
            oversized = any(len(f) > 1 << 20 for f in frames)
            sock = socks[3] if oversized else rng.choice(socks[:3])
            try:
                sock.send_multipart(frames)
                sent[0] += 1
            except zmq.Again:
                pass
            while insider.poll(0):
                header = protocol.parse_header(insider.recv_multipart()[0])
                if header["type"] == "TASK":  # answer the real task with a hostile tree, or a mutated header
                    answer = dict(v=PROTOCOL_VERSION, type="BATCH", session=header["session"], task=header["task"],
                                  epoch=header["epoch"], seq=header["seq"], tree=None, errors=[])
                    if rng.random() < 0.5:
                        answer["tree"], extra = bad_tree(rng)
                        insider.send_multipart([pack(answer), *extra])
                    else:
                        insider.send_multipart([pack(mutate(rng, answer)), b"junk"])
                    sent[0] += 1
            if i % 200 == 0:
                insider.send(protocol.pack(protocol.PING, load={}))
                stop.wait(0.001)
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()


def fingerprint_len_print(length: int) -> str:
    return dataset_fingerprint(PairDataset(length))


def fake_consumer(router: zmq.Socket, seed: int, count: int, stop: threading.Event, sent: list) -> None:
    """Welcome every producer that says HELLO, then send the live ones hostile messages in turn, with a PING
    to each every 0.1 s so that they keep serving (and validate TASKs rather than set them aside as stale).
    Only sends that succeed are counted; a peer that vanished (libzmq drops a connection that sends an
    oversized frame; the producer comes back under a new routing id) is forgotten."""
    rng = random.Random(seed)
    session = 424242
    templates = producer_templates(session)
    peers: list[bytes] = []
    turn, next_ping = 0, 0.0
    deadline = time.monotonic() + ATTACK_S
    while sent[0] < count and not stop.is_set() and time.monotonic() < deadline:
        while router.poll(0):
            frames = router.recv_multipart()
            try:
                header = protocol.parse_header(frames[1])
            except ProtocolError:
                continue
            if header["type"] == "HELLO":  # a producer greeting anew (it drops a session after 16 invalid messages)
                try:
                    router.send_multipart([frames[0], protocol.pack(protocol.WELCOME, session=session, heartbeat=0.2,
                                                                    **welcome_fields(), nonce=header["nonce"])])
                except zmq.ZMQError:  # gone since its HELLO (EHOSTUNREACH): it says HELLO again under a new id
                    continue
            if frames[0] not in peers:  # also a PING: a producer that reconnected under a new id
                peers.append(frames[0])
        if not peers:
            stop.wait(0.01)
            continue
        now = time.monotonic()
        if now >= next_ping:
            for peer in list(peers):
                try:
                    router.send_multipart([peer, protocol.pack(protocol.PING, load={})], flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    peers.remove(peer)
            next_ping = now + 0.1
            continue
        turn += 1
        peer = peers[turn % len(peers)]
        try:
            # a few oversized frames in all: each costs the producer this connection until its liveness
            # timeout rebuilds the socket (libzmq does not reconnect after a protocol error)
            router.send_multipart([peer, *hostile_frames(rng, templates, max_frame=MAX_HEADER_BYTES,
                                                         oversize_rate=0.003)], flags=zmq.NOBLOCK)
            sent[0] += 1
        except zmq.Again:
            stop.wait(0.001)  # its queue is full: let it drain
        except zmq.ZMQError:
            peers.remove(peer)  # gone (EHOSTUNREACH): it will say HELLO again under a new id
        if turn % 100 == 0:
            stop.wait(0.001)


def hostile_peers(endpoint: str, fake_endpoint: str, seed: int, length: int, stop, counts) -> None:
    """The child process that plays both attackers: a fuzzing client of the consumer, and a fake consumer
    that fuzzes the producers. It runs apart from the consumer so that the consumer's RSS is its own: the
    attackers' queued megabyte frames would otherwise count as the consumer's growth."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(fake_endpoint)
    to_consumer, to_producers = [0], [0]
    threads = [
        threading.Thread(target=fuzz_consumer, args=(endpoint, seed, MESSAGES, length, stop, to_consumer)),
        threading.Thread(target=fake_consumer, args=(router, seed + 1, MESSAGES, stop, to_producers)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    router.close(0)
    counts[0], counts[1] = to_consumer[0], to_producers[0]


@pytest.mark.slow  # about 19 s on 2 loaded cores: the default suite stays under 5 minutes (.ci/run runs -m slow)
def test_fuzzed_consumer_and_producers_keep_serving_exact_batches(endpoint, spawn):
    seed = fuzz_seed()
    length = 400
    fake_endpoint = f"tcp://127.0.0.1:{free_port()}"
    producers = [spawn([endpoint, fake_endpoint], "tests.datasets:PairDataset", {"length": length}, threads=2)
                 for _ in range(2)]
    mp = multiprocessing.get_context("spawn")
    stop, counts = mp.Event(), mp.Array("q", 2)
    attackers = mp.Process(target=hostile_peers, args=(endpoint, fake_endpoint, seed, length, stop, counts))
    try:
        with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=2, heartbeat=0.2, timeout=30,
                          task_timeout=2.0, max_batch_bytes=1 << 20) as loader:
            wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
            list(loader)  # warm up: allocations of a first epoch are not growth
            pids: dict[str, int | str] = {"consumer": "self"}
            pids.update({f"producer {p.pid}": p.pid for p in producers})
            before = {name: rss_mb(pid) for name, pid in pids.items()}
            sampler = RssSampler(pids)
            attackers.start()
            try:
                epoch, deadline = 1, time.monotonic() + ATTACK_S + 30
                while attackers.is_alive() and time.monotonic() < deadline:
                    loader.set_epoch(epoch)
                    got = list(loader)
                    expected = reference_batches(PairDataset(length), batch_size=4, drop_last=False, world_size=1,
                                                 rank=0, shuffle=True, seed=2, epoch=epoch)
                    assert len(got) == len(expected), f"epoch {epoch} (seed {seed})"
                    for seq, (g, e) in enumerate(zip(got, expected)):
                        assert_tree_equal(g, e, f"epoch {epoch} batch {seq} (seed {seed})")
                    epoch += 1
            finally:
                stop.set()
                attackers.join(60)
                peak = sampler.stop()
            stats = loader.stats()
            after = rss_mb()
            assert consumer_threads_alive(loader), "a consumer thread died"
    finally:
        if attackers.is_alive():
            attackers.kill()
            attackers.join(10)
    assert attackers.exitcode == 0, f"the attacking process failed (exit {attackers.exitcode}, seed {seed})"
    assert counts[0] >= MESSAGES and counts[1] >= MESSAGES, list(counts)
    assert stats["invalid_messages"] > MESSAGES // 4, stats  # about half of what is sent is malformed
    assert sampler.samples > 50, f"RSS sampled only {sampler.samples} times during the attack"
    growth = {name: peak[name] - before[name] for name in pids}
    print("RSS growth at its peak during the attack (MB):", {name: round(g, 1) for name, g in growth.items()})
    assert after - before["consumer"] < RSS_BOUND_MB, (
        f"consumer RSS grew by {after - before['consumer']:.0f} MB under fuzzing (seed {seed})")
    assert growth["consumer"] < RSS_PEAK_BOUND_MB, (
        f"consumer RSS peaked {growth['consumer']:.0f} MB above its start under fuzzing (seed {seed})")
    for name, grew in growth.items():
        if name != "consumer":
            assert grew < PRODUCER_RSS_BOUND_MB, f"{name} RSS peaked {grew:.0f} MB above its start (seed {seed})"
    for producer in producers:
        assert producer.proc.poll() is None, f"producer died under fuzzing: {producer.output()[-2000:]}"
        assert "invalid message" in producer.output()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_parse_header_only_ever_raises_protocol_error(data):
    try:
        protocol.parse_header(data)
    except ProtocolError:
        pass


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_like, st.lists(st.binary(max_size=32), max_size=4))
def test_decode_tree_only_ever_raises_protocol_error(spec, frames):
    try:
        decode_tree(spec, frames)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["t", "d", "s", "f", "v", "k"]), json_like, max_size=5))
def test_decode_tree_survives_array_like_nodes(node):
    try:
        decode_tree(node, [b"\0" * 16])
    except ProtocolError:
        pass


def test_task_timeout_drops_a_producer_that_never_answers(endpoint, spawn):
    """A live peer that takes tasks and never answers cannot stall the epoch."""
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, task_timeout=1.0) as loader:
        ctx = zmq.Context()
        silent = dealer(ctx, endpoint)
        try:
            silent.send(hello("silent", slots=4, length=40, fingerprint=dataset_fingerprint(PairDataset(40))))
            wait_for(lambda: loader.stats()["producers"] == 1, 10, "the silent peer to register")
            it = iter(loader)
            wait_for(lambda: loader.stats()["in_flight"] > 0, 10, "tasks to go to the silent peer")
            spawn(endpoint, "tests.datasets:PairDataset", {"length": 40})
            stop = threading.Event()

            def keep_alive():
                while not stop.wait(0.1):
                    silent.send(protocol.pack(protocol.PING, load={}))
                    while silent.poll(0):
                        silent.recv_multipart()

            pinger = threading.Thread(target=keep_alive)
            pinger.start()
            try:
                labels = [y.tolist() for _, y in it]
            finally:
                stop.set()
                pinger.join(10)
        finally:
            silent.close(0)
            ctx.term()
        assert labels == [list(range(i, i + 4)) for i in range(0, 40, 4)]
        assert loader.stats()["reissued"] >= 1


LIES = {
    "wrong sample count": lambda n: [__import__("numpy").zeros((n - 1, 3, 4), "float32"),
                                     __import__("numpy").zeros(n - 1, "int64")],
    "bytes tree": lambda n: b"junk",
    "wrong dtype": lambda n: [__import__("numpy").zeros((n, 3, 4), "float64"), __import__("numpy").zeros(n, "int64")],
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_insider_with_well_formed_but_wrong_batches_never_reaches_the_loop(endpoint, spawn, lie):
    """A registered peer answers its real tasks with valid-looking batches of the wrong structure. None is
    delivered: the seq is re-issued to a real producer, and the liar is dropped and rejected for good (else,
    holding the most free slots, it would take the same seq back every time and stall the epoch)."""
    from ferry.common.codec import encode_tree

    length = 60
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30) as loader:
        spawn(endpoint, "tests.datasets:PairDataset", {"length": length})
        wait_for(lambda: loader.stats()["producers"] == 1, 20, "the real producer")
        it = iter(loader)
        first = next(it)  # the structure of this dataset is now known
        ctx = zmq.Context()
        insider = dealer(ctx, endpoint)
        answered, rejections = 0, []
        stop = threading.Event()

        def serve() -> None:
            nonlocal answered
            while not stop.is_set():
                if not insider.poll(50):
                    continue
                header = protocol.parse_header(insider.recv_multipart()[0])
                if header["type"] == "REJECT":
                    rejections.append(header)
                if header["type"] != "TASK":
                    continue
                spec, frames = encode_tree(LIES[lie](len(header["indices"])))
                insider.send_multipart([protocol.pack(protocol.BATCH, session=header["session"], task=header["task"],
                                                      epoch=header["epoch"], seq=header["seq"], tree=spec, errors=[]),
                                        *frames])
                answered += 1

        insider.send(hello("insider", slots=4, length=length, fingerprint=dataset_fingerprint(PairDataset(length))))
        worker = threading.Thread(target=serve)
        worker.start()
        try:
            # registered before the loop goes on, or (on a loaded machine) the real producer could finish the
            # epoch alone and the liar would never be tested
            wait_for(lambda: loader.stats()["producers_seen"] == 2, 10, "the insider to register")
            rest = [y.tolist() for _, y in it]
            wait_for(lambda: rejections, 10, "the liar's permanent REJECT")
        finally:
            stop.set()
            worker.join(10)
            insider.close(0)
            ctx.term()
        stats = loader.stats()
    assert [first[1].tolist()] + rest == [list(range(i, i + 4)) for i in range(0, length, 4)]
    assert answered >= 1 and stats["invalid_messages"] >= 1 and stats["reissued"] >= 1
    assert rejections[0]["permanent"] and "unusable" in rejections[0]["reason"]
    assert stats["producers"] == 1 and stats["duplicates"] >= answered - 1  # its other answers: dropped


def test_producer_rebuilds_its_connection_after_a_protocol_error(spawn):
    """libzmq never reconnects a socket that received an oversized frame; the producer must, on its own."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    try:
        producer = spawn(endpoint, "synthetic", {"length": 10})

        def next_hello(timeout_ms: int) -> bytes | None:
            while router.poll(timeout_ms):
                frames = router.recv_multipart()
                header = protocol.parse_header(frames[1])
                if header["type"] == "HELLO":
                    router.send_multipart([frames[0], protocol.pack(protocol.WELCOME, session=7, heartbeat=0.2, **welcome_fields(),
                                                                    nonce=header["nonce"])])
                    return frames[0]
            return None

        first = next_hello(10_000)
        assert first is not None
        router.send_multipart([first, b"\0" * (MAX_HEADER_BYTES + 1)])  # over its MAXMSGSIZE: link dropped
        again = next_hello(10_000)
        assert again is not None and again != first, "the producer never came back after the protocol error"
        assert producer.proc.poll() is None
    finally:
        router.close(0)
        ctx.term()
