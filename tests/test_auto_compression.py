"""compression="auto" decided by the consumer (consumer/core/compression.py), driven by scripted arrivals and
waits: no socket, no clock. Then the core's side: which TASKs name a codec, for which links, and how each
arriving batch is attributed to the codec its task asked for.

The link in these tests is a model: batches of RAW bytes arrive one after another at the rate the scenario
gives for the codec their task asked for, with DEPTH tasks in flight (so after a change of codec the batches
asked the old way still come first, as over a real link), while the training loop waits for data for a given
share of the time.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from ferry.common import protocol
from ferry.common.codec import encode_tree
from ferry.consumer.core import ConsumerCore, CoreConfig
from ferry.consumer.core.compression import (
    HOLD_FIRST_S, RATE_S, RECHECK_S, TRIAL_IDLE_WINDOWS, WINDOW_BATCHES, WINDOW_S, AutoCodec, is_local_address,
)
from ferry.producer.loading.compressing import FrameCompressor

from .test_core import Loop

MB = 1e6
RAW = 10_000_000  # bytes of each batch
DEPTH = 4  # tasks in flight


class Link:
    """A consumer's remote links under "auto", fed by a modelled link (see the module docstring)."""

    def __init__(self, rates: dict[str, float], decode: dict[str, float] | None = None,
                 codecs=("lz4", "zstd")) -> None:
        self.auto = AutoCodec(codecs)
        self.rates = dict(rates)  # codec -> raw bytes per second delivered while starved
        self.decode = decode or {}  # codec -> the io thread's decompress rate (raw bytes/s); absent: free
        self.now = self.waited = 0.0
        self.in_flight: deque[str] = deque(["none"] * DEPTH)  # the codecs their tasks asked for
        self.asked: list[str] = []  # the codec of each arrival's task
        self.lines: list[str] = []

    def run(self, batches: int, waiting: float = 1.0) -> list[str]:
        """``batches`` arrivals while the loop waits for data ``waiting`` of the time. Returns their codecs."""
        out = []
        for _ in range(batches):
            codec = self.in_flight.popleft()
            gap = RAW / self.rates[codec]
            self.now += gap
            self.waited += waiting * gap
            decode_s = RAW / self.decode[codec] if codec in self.decode else 0.0
            wire = RAW // 2 if codec != "none" else RAW
            self.lines += self.auto.arrived(codec, RAW, wire, decode_s, self.now, self.waited)
            self.in_flight.append(self.auto.codec)  # the credit it freed goes out as a task asking for this
            out.append(codec)
        self.asked += out
        return out

    def pause(self, seconds: float) -> None:
        """The loop does something else (another loader's turn, an evaluation): no arrivals, no waiting."""
        self.now += seconds

    def log(self) -> str:
        return "\n".join(self.lines)


# --- the decision ----------------------------------------------------------------------------------------------
def test_a_faster_codec_is_kept_and_a_slower_one_up_the_ladder_goes_back():
    link = Link({"none": 100 * MB, "lz4": 200 * MB, "zstd": 150 * MB})
    link.run(80)
    assert link.auto.codec == "lz4" and link.auto.trying is None
    assert "zstd" in link.asked  # tried
    assert "lz4 kept: 200 MB/s of raw data, 2.0x smaller on the wire, against 100 MB/s with uncompressed" in link.log()
    assert "back to lz4: zstd did not pay (it delivered 150 MB/s of raw data, against 200 MB/s before)" in link.log()
    assert link.run(40)[-30:] == ["lz4"] * 30  # settled, held: no new trial within HOLD_FIRST_S


def test_the_best_codec_wins_when_it_pays_on_each_step():
    link = Link({"none": 100 * MB, "lz4": 180 * MB, "zstd": 260 * MB})
    link.run(80)
    assert link.auto.codec == "zstd" and link.auto.trying is None


def test_a_codec_that_slows_delivery_goes_back_and_is_held_with_a_back_off():
    # the receiver-bound case: the io thread decompressing costs more than the wire saves
    link = Link({"none": 2000 * MB, "lz4": 1500 * MB, "zstd": 900 * MB})
    link.run(600)
    assert link.auto.codec == "none" and "back to uncompressed: lz4 did not pay" in link.log()
    assert f"not tried again for {HOLD_FIRST_S:.0f} s" in link.log()
    trial_s = link.asked.count("lz4") * RAW / (1500 * MB)
    assert 0 < trial_s < RATE_S + 3 * WINDOW_S  # the trial lasts about what its rate needs
    assert "zstd" not in link.asked  # never climbed past a codec that did not pay
    holds = []
    for _ in range(4):  # each failed trial doubles the hold: nothing is tried before it ends
        before = len(link.lines)
        started = link.now
        while not any("trying lz4" in line for line in link.lines[before:]):
            link.run(1)
            assert link.now - started < 10 * HOLD_FIRST_S * 2 ** len(holds), "never tried again"
        holds.append(link.now - started)
        link.run(400)
        assert link.auto.codec == "none"
    # each wait until the next trial is at least the hold, which doubles
    assert [round(h / HOLD_FIRST_S) for h in holds] == [1, 2, 4, 8]


def test_a_trial_whose_decompression_alone_is_too_slow_fails_after_three_batches():
    link = Link({"none": 500 * MB, "lz4": 2000 * MB}, decode={"lz4": 400 * MB})  # the wire would be fast enough
    link.run(40)
    assert link.auto.codec == "none"
    assert "the io thread decompresses only 400 MB/s of it, against 500 MB/s delivered before" in link.log()
    assert link.asked.count("lz4") <= DEPTH + 3
    # not tried again, hold or no hold, while the link delivers more than the io thread could decompress
    link.run(int(4 * HOLD_FIRST_S * 500 * MB / RAW))
    assert link.log().count("trying lz4") == 1 and link.asked.count("lz4") <= DEPTH + 3
    link.rates["none"] = 200 * MB  # the link slowed down: now lz4 might pay
    link.run(40)
    assert link.log().count("trying lz4") == 2 and link.auto.codec == "lz4"


def test_windows_in_which_the_loop_did_not_wait_are_ignored():
    link = Link({"none": 100 * MB, "lz4": 200 * MB, "zstd": 100 * MB})
    link.run(8)
    link.pause(30.0)  # another loader's turn: were it counted, "none" would look 10x slower
    link.run(6, waiting=0.1)  # a model-bound stretch: the loop hardly waited
    assert link.auto.rate("none") == pytest.approx(100 * MB)
    assert link.auto.trying == "lz4"
    link.run(3)
    link.pause(30.0)  # paused in the middle of the trial, too
    link.run(20)
    assert "lz4 kept: 200 MB/s" in link.log()


def test_nothing_is_tried_while_the_loop_does_not_wait_for_data():
    link = Link({"none": 100 * MB, "lz4": 300 * MB})
    assert link.run(200, waiting=0.3) == ["none"] * 200 and link.lines == []


def test_a_trial_during_which_the_loop_stops_waiting_keeps_its_codec():
    link = Link({"none": 100 * MB, "lz4": 300 * MB})
    link.run(8)
    assert link.auto.trying == "lz4"
    batches = 0
    while link.auto.trying is not None and batches < 500:
        batches += len(link.run(1, waiting=0.2))  # with lz4 the loop no longer starves
    assert link.auto.codec == "lz4" and link.auto.trying is None
    assert batches >= TRIAL_IDLE_WINDOWS * WINDOW_BATCHES  # not before that many windows said so
    assert "lz4 kept: the training loop seldom waited for data during the trial" in link.log()


def test_a_kept_codec_is_checked_again_against_the_one_below_as_conditions_change():
    link = Link({"none": 100 * MB, "lz4": 200 * MB, "zstd": 150 * MB})
    link.run(80)
    assert link.auto.codec == "lz4"
    link.rates = {"none": 1000 * MB, "lz4": 200 * MB, "zstd": 150 * MB}  # the link became much faster
    started = link.now
    while (link.auto.codec, link.auto.trying) != ("none", None) and link.now - started < 4 * RECHECK_S:
        link.run(1)
    assert link.auto.codec == "none" and link.now - started >= RECHECK_S - HOLD_FIRST_S
    assert "uncompressed kept: 1000 MB/s of raw data, against 200 MB/s with lz4" in link.log()
    link.run(40)
    assert link.auto.codec == "none"


def test_only_codecs_the_consumer_has_are_tried():
    link = Link({"none": 100 * MB, "lz4": 300 * MB, "zstd": 300 * MB}, codecs=("zstd",))
    link.run(60)
    assert link.auto.codec == "zstd" and "lz4" not in link.asked
    assert AutoCodec(()).ladder == ("none",)


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("::ffff:127.0.0.1", True),
    ("", True), (None, True), ("localhost:0:0:4242", True),  # ipc reports credentials, inproc nothing
    ("10.0.0.2", False), ("192.168.1.7", False), ("2001:db8::1", False), ("fe80::1%eth0", False),
])
def test_local_addresses(address, local):
    assert is_local_address(address) is local


# --- the core: which TASKs name a codec ---------------------------------------------------------------------------
class AutoLoop(Loop):
    """A core under ``compression`` with producers whose addresses are given."""

    def __init__(self, compression: str = "auto", **kwargs) -> None:
        super().__init__(**kwargs)
        self.core = ConsumerCore(CoreConfig(capacity=4, heartbeat=1.0, liveness=3, task_timeout=1e6, on_error="raise",
                                            max_batch_bytes=1 << 24, max_attempts=3, compression=compression,
                                            codecs=("lz4", "zstd")),
                                 session=77, now=0.0, counters=self.counters)
        self.addresses: dict[bytes, str] = {}
        self.counters.waiting_since = 0.0  # the training loop waits for data all along

    def receive(self, peer, header, *frames) -> None:
        if isinstance(header, dict):
            header = protocol.pack(header.pop("type"), **header)
        self.apply(self.core.received([peer, header, *frames], self.now, address=self.addresses.get(peer, "")))

    def answer_compressed(self, peer: bytes, task: dict, after: float) -> None:
        """A batch of 256 KiB of whole-number float32 for ``task``, compressed as its TASK says, ``after`` s."""
        self.now += after
        array = (np.arange(1 << 16) % 7).astype(np.float32).reshape(1, -1)
        spec, frames = encode_tree(array)
        if "compression" in task:
            compressor = FrameCompressor(1)
            try:
                out = compressor.apply(task["compression"], spec, list(frames))
            finally:
                compressor.close()
            spec, frames = out.spec, out.frames
        self.receive(peer, dict(type=protocol.BATCH, session=task["session"], task=task["task"], epoch=task["epoch"],
                                seq=task["seq"], tree=spec, errors=[]), *[bytes(f) for f in frames])


def serve(loop: AutoLoop, peers: dict[bytes, dict[str, float]], batches: int) -> None:
    """Each peer answers its tasks in order, after a gap that depends on the codec its task asked for; the
    training loop takes every batch at once."""
    answered: set[int] = set()
    for _ in range(batches):
        for peer, gaps in peers.items():
            pending = [t for t in loop.tasks(peer) if t["task"] not in answered and t["task"] in loop.core.dispatcher.tasks]
            if pending:
                task = pending[0]
                answered.add(task["task"])
                loop.answer_compressed(peer, task, gaps[task.get("compression", "none")])
        while loop.delivered:
            loop.take()


def test_welcome_lists_the_codecs_and_tasks_name_none_under_auto_until_a_trial():
    loop = AutoLoop(length=256)
    loop.addresses[b"far"] = "10.0.0.2"
    loop.hello(b"far")
    welcome = next(h for _, h, _ in loop.sent if h["type"] == protocol.WELCOME)
    assert welcome["codecs"] == ["lz4", "zstd"] and "compression" not in welcome
    loop.start()
    assert [t.get("compression") for t in loop.tasks(b"far")] == [None, None]


def test_remote_links_get_the_codec_that_pays_and_local_links_never_compress():
    loop = AutoLoop(length=400)
    loop.addresses.update({b"far": "10.0.0.2", b"near": "127.0.0.1", b"ipc": "localhost:0:0:99"})
    for peer in (b"far", b"near", b"ipc"):
        loop.hello(peer)
    loop.start()
    # the remote link delivers twice as fast with lz4; zstd is no better than lz4; the local ones are fast anyway
    serve(loop, {b"far": {"none": 0.2, "lz4": 0.1, "zstd": 0.1}, b"near": {"none": 0.05}, b"ipc": {"none": 0.05}},
          120)
    lines = "\n".join(log.message for log in loop.logs)
    assert "compression: trying lz4 on the remote links" in lines and "lz4 kept" in lines
    assert loop.core.codecs.auto.codec == "lz4"
    assert {t.get("compression") for t in loop.tasks(b"near")} == {None}
    assert {t.get("compression") for t in loop.tasks(b"ipc")} == {None}
    assert loop.tasks(b"far")[-1]["compression"] == "lz4"
    assert loop.counters.compressed_bytes > 0 and loop.counters.uncompressed_bytes > 2 * loop.counters.compressed_bytes


def test_a_producer_that_mapped_the_shared_memory_slab_is_local_whatever_its_address():
    loop = AutoLoop()
    loop.addresses[b"a"] = "10.0.0.2"
    loop.hello(b"a")
    assert loop.core.dispatcher.producers[b"a"].remote
    loop.core.dispatcher.producers[b"a"].shared = True  # as admission marks a producer that mapped our slab
    loop.hello(b"a")  # a repeated HELLO: looked at again
    assert not loop.core.dispatcher.producers[b"a"].remote


@pytest.mark.parametrize("compression, expected", [("lz4", "lz4"), ("zstd", "zstd"), ("none", None)])
def test_an_explicit_codec_is_named_in_every_task_local_or_not(compression, expected):
    loop = AutoLoop(compression=compression)
    loop.addresses[b"far"] = "10.0.0.2"
    loop.hello(b"far")
    loop.hello(b"near")
    loop.start()
    assert {t.get("compression") for t in loop.tasks()} == {expected}
    assert loop.core.codecs.auto is None


def test_batches_are_attributed_to_the_codec_their_task_asked_for():
    loop = AutoLoop(length=400)
    loop.addresses[b"far"] = "10.0.0.2"
    loop.hello(b"far", slots=4)
    loop.start()
    seen = []
    original = loop.core.codecs.auto.arrived
    loop.core.codecs.auto.arrived = lambda codec, *args: seen.append(codec) or original(codec, *args)
    serve(loop, {b"far": {"none": 0.2, "lz4": 0.1, "zstd": 0.1}}, 60)
    asked = [t.get("compression", "none") for t in loop.tasks(b"far")][: len(seen)]
    assert seen == asked and "lz4" in seen  # in order: one producer answers its tasks in order
    assert not loop.core.codecs.judged.keys() - loop.core.dispatcher.tasks.keys()  # nothing kept for answered tasks


def test_a_lost_producers_tasks_are_forgotten():
    loop = AutoLoop(length=64)
    loop.addresses[b"far"] = "10.0.0.2"
    loop.hello(b"far", slots=4)
    loop.start()
    assert len(loop.core.codecs.judged) == 4
    loop.receive(b"far", dict(type=protocol.BYE))
    assert loop.core.codecs.judged == {}
    loop.addresses[b"far2"] = "10.0.0.3"
    loop.hello(b"far2", producer="far2", slots=4)
    assert len(loop.core.codecs.judged) == 4
    loop.start()  # a new run forgets the old one's tasks
    assert set(loop.core.codecs.judged) == set(loop.core.dispatcher.tasks)

