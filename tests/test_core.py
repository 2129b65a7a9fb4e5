"""The consumer core, driven by scripted events: messages in, actions out. No socket, no thread, no clock.

Each test plays producers by hand (HELLO, BATCH, FAIL, PING, BYE as the bytes a DEALER would send) and a
training loop (start a run, release what it takes), and checks what the core sends and hands on: credits,
exact order, exactly-once through losses, attempts and poison, who may answer a task, slots of lost
producers, and what invalid input costs. Process-level tests (tests/test_failover.py, test_fuzz.py, ...) show
the same rules through real sockets; here each rule is pinned where it lives.
"""

from __future__ import annotations

import gc
import logging
import os

import msgpack
import numpy as np
import pytest

from ferry.common import protocol, shm
from ferry.common.codec import encode_tree
from ferry.common.errors import PoisonTaskError, RemoteSampleError, SampleIndexError
from ferry.common.plan import EpochPlan
from ferry.consumer.core import ConsumerCore, CoreConfig, Deliver, EndOfRun, Log, Send, sequencer_for
from ferry.consumer.figures.counters import Counters

from .netns import cannot_run

SAMPLES = 16


class Loop:
    """A consumer core and the training loop around it: what it sent, what it handed on, what was released."""

    def __init__(self, *, capacity: int = 4, max_attempts: int = 3, on_error: str = "raise", length: int = SAMPLES,
                 slab=None, in_order: bool = True, batch_size: int = 1) -> None:
        self.counters = Counters()
        self.core = ConsumerCore(CoreConfig(capacity=capacity, heartbeat=1.0, liveness=3, task_timeout=10.0,
                                            on_error=on_error, max_batch_bytes=1 << 20, max_attempts=max_attempts),
                                 session=77, now=0.0, counters=self.counters, slab=slab)
        self.length, self.batch_size, self.in_order = length, batch_size, in_order
        self.now = 0.0
        self.sent: list[tuple[bytes, dict, list]] = []  # (peer, header, frames) of every Send
        self.delivered: list = []  # items handed on, in order
        self.logs: list[Log] = []
        self.run = 0

    def apply(self, actions) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.sent.append((action.peer, protocol.parse_header(action.frames[0]), action.frames[1:]))
            elif isinstance(action, Deliver):
                self.delivered.append(action.item)
            else:
                self.logs.append(action)

    def start(self, first: int = 0, *, epoch: int = 0) -> None:
        self.run += 1
        plan = EpochPlan.from_indices(epoch, np.arange(self.length), self.batch_size, False)
        self.apply(self.core.start_run(sequencer_for(self.run, plan, first, (0, 0), in_order=self.in_order),
                                       epoch, self.now))

    def receive(self, peer: bytes, header: bytes | dict, *frames) -> None:
        if isinstance(header, dict):
            header = msgpack.packb({"v": protocol.PROTOCOL_VERSION, **header}, use_bin_type=True)
        self.apply(self.core.received([peer, header, *frames], self.now))

    def tick(self, seconds: float = 1.0, exited=()) -> None:
        self.now += seconds
        self.apply(self.core.tick(self.now, exited))

    def take(self):
        """The training loop takes the next handed-on item and gives its credit back."""
        item = self.delivered.pop(0)
        if not isinstance(item, EndOfRun):
            self.apply(self.core.released(item.run, self.now))
        return item

    # --- the producers' side ------------------------------------------------------------------------------
    def hello(self, peer: bytes, producer: str = "", *, nonce: int = 1, slots: int = 2, pid: int = 100,
              shm_token: str | None = None, ahead: int | None = None) -> None:
        message = dict(type=protocol.HELLO, producer=producer or peer.decode(), nonce=nonce, host="h", pid=pid,
                       slots=slots, dataset={"spec": "s", "len": self.length, "fingerprint": "f"})
        if shm_token is not None:
            message["shm"] = shm_token
        if ahead is not None:
            message["ahead"] = ahead
        self.receive(peer, message)

    def tasks(self, peer: bytes | None = None) -> list[dict]:
        """TASKs sent (to ``peer``), in order."""
        return [h for p, h, _ in self.sent if h["type"] == protocol.TASK and (peer is None or p == peer)]

    def answer(self, peer: bytes, task: dict, *, value: float | None = None, slab=None) -> None:
        """A BATCH for ``task``: its samples' indices as floats (or ``value``); written into the task's slot of
        ``slab`` when given, as a local producer does."""
        indices = np.array(task["indices"], dtype=np.float32) if value is None else np.full(1, value, np.float32)
        writer = shm.SlabMapping(slab.path).writer(tuple(task["slot"])) if slab is not None else None
        spec, frames = encode_tree(indices, slot=writer)
        self.receive(peer, dict(type=protocol.BATCH, session=task["session"], task=task["task"], epoch=task["epoch"],
                                seq=task["seq"], tree=spec, errors=[]), *[bytes(f) for f in frames])

    def fail(self, peer: bytes, task: dict, exc_type: str = "KeyError") -> None:
        error = {"index": task["indices"][0], "exc_type": exc_type, "message": "no such key", "traceback": "tb"}
        self.receive(peer, dict(type=protocol.FAIL, session=task["session"], task=task["task"], epoch=task["epoch"],
                                seq=task["seq"], errors=[error]))

    def batches(self) -> list:
        """Take every handed-on item; a batch as the indices it holds, an error as itself."""
        out = []
        while self.delivered:
            item = self.take()
            out.append(item if isinstance(item, EndOfRun) else item.error or item.tree.tolist())
        return out

    def in_flight(self) -> int:
        return self.core.dispatcher.in_flight


def answer_all(loop: Loop, peer: bytes) -> None:
    """``peer`` answers every task it holds, newest first (so that order is the core's doing)."""
    answered = {h["task"] for p, h, _ in loop.sent if p == peer and h["type"] == "answered"}
    for task in reversed([t for t in loop.tasks(peer) if t["task"] in loop.core.dispatcher.tasks]):
        if task["task"] not in answered:
            loop.answer(peer, task)


# --- admission --------------------------------------------------------------------------------------------------
def test_a_hello_is_welcomed_with_the_session_and_the_consumer_learns_the_dataset():
    loop = Loop()
    assert not loop.core.peers.dataset_known
    loop.hello(b"a", nonce=5)
    (peer, welcome, _), = loop.sent
    assert peer == b"a" and welcome["type"] == protocol.WELCOME and welcome["session"] == 77
    assert welcome["nonce"] == 5 and welcome["heartbeat"] == 1.0 and welcome["max_batch_bytes"] == 1 << 20
    assert loop.core.peers.dataset_len == SAMPLES and not loop.core.sharded
    assert any("joined (2 slots); 1 live" in log.message for log in loop.logs)


# --- credits and order --------------------------------------------------------------------------------------------
def test_buffered_plus_in_flight_never_exceeds_the_capacity_and_each_release_issues_one_task():
    loop = Loop(capacity=3)
    loop.hello(b"a", slots=8)
    loop.start()
    assert len(loop.tasks()) == 3  # as many as the credits, though the producer has 8 slots
    taken = 0
    for _ in range(SAMPLES * 3):
        outstanding = len(loop.tasks()) - taken  # sent and not yet taken by the loop: credits in use
        assert outstanding <= 3, f"{outstanding} tasks outstanding with capacity 3"
        pending = [t for t in loop.tasks() if t["task"] in loop.core.dispatcher.tasks]
        if pending:
            loop.answer(b"a", pending[-1])
        elif loop.delivered:
            item = loop.take()
            if isinstance(item, EndOfRun):
                break
            taken += 1
    assert taken == SAMPLES and len(loop.tasks()) == SAMPLES


def test_a_producer_that_takes_tasks_ahead_is_given_them_and_its_answers_release_each_in_turn():
    loop = Loop(capacity=8)
    loop.hello(b"a", slots=2, ahead=3)
    assert any("joined (2 slots, 3 ahead); 1 live" in log.message for log in loop.logs)
    loop.start()
    assert len(loop.tasks(b"a")) == 5  # its window: 2 slots + 3 ahead, within the capacity of 8
    loop.answer(b"a", loop.tasks(b"a")[0])
    assert len(loop.tasks(b"a")) == 6, "an answer frees a place in its window: the next task goes out at once"
    loop.hello(b"b", slots=2)  # a producer that says nothing of ahead gets its slots only
    assert len(loop.tasks(b"b")) == 2


def test_a_task_that_never_reached_a_producer_back_on_a_new_connection_is_issued_again_free():
    loop = Loop(capacity=8, max_attempts=1)
    loop.hello(b"a", slots=2)
    loop.start()
    first, second = loop.tasks(b"a")
    loop.hello(b"a2", producer="a")  # the same producer (same nonce) on a new connection: it keeps its tasks
    loop.apply(loop.core.unsent(b"a", [second["task"]], loop.now))  # the TASK sent on the old one found no one
    again = [t for t in loop.tasks(b"a2") if t["seq"] == second["seq"]]
    assert len(again) == 1 and again[0]["task"] != second["task"], "issued again, to the producer it was meant for"
    assert not [log for log in loop.logs if "lost" in log.message or "not issued again" in log.message]
    assert set(loop.core.dispatcher.producers[b"a2"].in_flight) == {first["task"], again[0]["task"]}


def test_batches_are_handed_on_in_plan_order_whatever_order_they_arrive_in():
    loop = Loop(capacity=8)
    loop.hello(b"a", slots=4)
    loop.hello(b"b", slots=4)
    loop.start()
    for _ in range(SAMPLES):
        answer_all(loop, b"b")
        answer_all(loop, b"a")
        loop.batches_taken = getattr(loop, "batches_taken", []) + loop.batches()
    assert loop.batches_taken == [[float(i)] for i in range(SAMPLES)] + [EndOfRun(1)]


def test_out_of_order_runs_hand_on_in_arrival_order_each_batch_once():
    loop = Loop(capacity=4, in_order=False)
    loop.hello(b"a", slots=4)
    loop.start()
    first = loop.tasks()
    loop.answer(b"a", first[2])
    loop.answer(b"a", first[0])
    assert [item.seq for item in loop.delivered] == [2, 0]


# --- exactly once -------------------------------------------------------------------------------------------------
def test_a_result_is_accepted_only_from_the_producer_that_holds_its_task():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=1)
    loop.hello(b"b", slots=1)
    loop.start()
    task_a, task_b = loop.tasks(b"a")[0], loop.tasks(b"b")[0]
    loop.answer(b"b", task_a, value=-1.0)  # b answers a's task: a duplicate, whatever it holds
    assert loop.counters.duplicates == 1 and loop.delivered == []
    assert task_a["task"] in loop.core.dispatcher.tasks  # still a's
    loop.answer(b"a", task_a)
    loop.answer(b"b", task_b)
    assert loop.batches() == [[float(task_a["indices"][0])], [float(task_b["indices"][0])]]


def test_task_ids_are_unique_across_runs_so_a_late_answer_of_an_abandoned_run_is_a_duplicate():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=2)
    loop.start()
    old = loop.tasks()
    loop.start()  # the loop abandoned its iteration and began a new one
    new = loop.tasks()[len(old):]
    assert {t["task"] for t in old}.isdisjoint(t["task"] for t in new)
    for task in old:
        loop.answer(b"a", task, value=-1.0)
    assert loop.delivered == [] and loop.counters.duplicates == len(old)
    loop.answer(b"a", new[0])
    assert [item.run for item in loop.delivered] == [2]


def test_a_lost_producer_s_tasks_go_first_to_another_and_each_batch_arrives_once():
    loop = Loop(capacity=4)
    loop.hello(b"a", slots=2)
    loop.hello(b"b", slots=2)
    loop.start()
    lost = [t["seq"] for t in loop.tasks(b"a")]
    loop.receive(b"b", {"type": protocol.PING, "load": {}})
    loop.tick(1.0)
    loop.receive(b"b", {"type": protocol.PING, "load": {}})
    loop.tick(2.5)  # a silent for 3.5 heartbeats, more than liveness 3: lost; b pinged in time
    assert list(loop.core.dispatcher.producers) == [b"b"]
    loop.hello(b"c", slots=2)  # b's slots are full: c takes the lost ones
    assert [t["seq"] for t in loop.tasks(b"c")] == lost  # re-issued first, in seq order
    for late in loop.tasks(b"a"):
        loop.answer(b"a", late, value=-1.0)  # the lost producer's late answers: strangers now
    got = []
    for _ in range(SAMPLES):
        answer_all(loop, b"b")
        answer_all(loop, b"c")
        got += loop.batches()
    assert got == [[float(i)] for i in range(SAMPLES)] + [EndOfRun(1)]


def test_an_orderly_bye_costs_no_attempt_so_rolling_restarts_never_poison_a_batch():
    loop = Loop(capacity=2, max_attempts=1)
    loop.start()
    for n in range(5):  # each producer takes seq 0 and leaves in order (SIGTERM: BYE)
        peer = b"p%d" % n
        loop.hello(peer, slots=1)
        assert loop.tasks(peer)[0]["seq"] == 0
        loop.receive(peer, {"type": protocol.BYE})
    assert loop.delivered == [] and loop.core.dispatcher.take_poisoned() == []
    loop.hello(b"last", slots=2)
    loop.answer(b"last", loop.tasks(b"last")[0])
    assert loop.batches() == [[0.0]]


def test_a_seq_lost_max_attempts_times_is_raised_in_its_place_naming_each_attempt():
    loop = Loop(capacity=2, max_attempts=2)
    loop.start()
    for n in range(2):
        peer = b"p%d" % n
        loop.hello(peer, slots=1, pid=100 + n)
        assert loop.tasks(peer)[0]["seq"] == 0
        loop.apply(loop.core.producer_died(f"h:{100 + n}", f"died (signal {n})", loop.now))
    (error,) = [item.error for item in loop.delivered]
    assert isinstance(error, PoisonTaskError) and error.seq == 0
    assert [cause for _, cause in error.attempts] == ["died (signal 0)", "died (signal 1)"]
    assert any(log.level == logging.ERROR for log in loop.logs)


def test_a_timeout_charges_only_the_task_held_too_long():
    loop = Loop(capacity=4, max_attempts=1)
    loop.hello(b"a", slots=1)
    loop.start()
    (task,) = loop.tasks(b"a")
    for _ in range(11):  # task_timeout 10 s; the producer keeps pinging
        loop.receive(b"a", {"type": protocol.PING, "load": {}})
        loop.tick(1.0)
    (error,) = [item.error for item in loop.delivered]
    assert isinstance(error, PoisonTaskError) and error.seq == task["seq"]
    assert "task_timeout" in error.attempts[0][1]


def test_an_unusable_batch_is_issued_again_first_and_its_producer_rejected_for_good():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=1)
    loop.hello(b"b", slots=1)
    loop.start()
    task = loop.tasks(b"a")[0]
    loop.receive(b"a", dict(type=protocol.BATCH, session=77, task=task["task"], epoch=0, seq=task["seq"] + 1,
                            tree=None, errors=[]))  # names another seq
    reject = [h for p, h, _ in loop.sent if p == b"a" and h["type"] == protocol.REJECT]
    assert reject and reject[0]["permanent"] and "unusable" in reject[0]["reason"]
    assert loop.counters.invalid_messages == 1 and b"a" not in loop.core.dispatcher.producers
    answer_all(loop, b"b")
    loop.batches()
    assert loop.tasks(b"b")[1]["seq"] == task["seq"]  # the seq went first to the producer left


# --- what a FAIL raises -------------------------------------------------------------------------------------------
def test_a_failed_sample_raises_at_its_batch_s_position_or_is_skipped():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=2)
    loop.start()
    first, second = loop.tasks(b"a")
    loop.fail(b"a", second)
    loop.answer(b"a", first)
    got = loop.batches()
    assert got[0] == [0.0] and isinstance(got[1], RemoteSampleError) and got[1].exc_type == "KeyError"
    skipping = Loop(capacity=2, on_error="skip")
    skipping.hello(b"a", slots=2)
    skipping.start()
    skipping.fail(b"a", skipping.tasks(b"a")[0])
    assert skipping.delivered == [] and skipping.counters.skipped_samples == 1  # nothing to yield, no credit
    assert len(skipping.tasks(b"a")) == 3


def test_an_index_outside_the_dataset_raises_without_a_task():
    loop = Loop(capacity=2, length=SAMPLES)
    loop.hello(b"a", slots=2)
    loop.run += 1
    plan = EpochPlan.from_batches(0, [[0], [SAMPLES + 3]])
    loop.apply(loop.core.start_run(sequencer_for(loop.run, plan, 0, (0, 0), in_order=True), 0, loop.now))
    assert [t["seq"] for t in loop.tasks(b"a")] == [0]
    assert loop.delivered == []  # its place comes after batch 0
    loop.answer(b"a", loop.tasks(b"a")[0])
    got = loop.batches()
    assert got[0] == [0.0] and isinstance(got[1], SampleIndexError) and got[1].seq == 1


# --- peers that are not registered, invalid input -------------------------------------------------------------------
def test_a_stranger_is_told_to_say_hello_once_per_heartbeat_and_invalid_input_is_counted():
    loop = Loop()
    for _ in range(3):
        loop.receive(b"x", {"type": protocol.PING, "load": {}})
    rejects = [h for p, h, _ in loop.sent if p == b"x" and h["type"] == protocol.REJECT]
    assert len(rejects) == 1 and not rejects[0]["permanent"]
    loop.receive(b"y", b"\xc1 not msgpack")
    loop.receive(b"y", b"\xc1 again")
    assert loop.counters.invalid_messages == 2
    assert [log.message for log in loop.logs if "invalid message" in log.message][0].startswith(
        "invalid message from peer 79 dropped: header is not valid msgpack")
    loop.receive(b"z", {"type": protocol.HELLO, "v": 99})  # another protocol version: told why, for good
    assert [h["permanent"] for p, h, _ in loop.sent if p == b"z"] == [True]


def test_a_heartbeat_pings_every_live_producer():
    loop = Loop()
    loop.hello(b"a")
    loop.hello(b"b")
    loop.tick(0.5)
    assert sorted(p for p, h, _ in loop.sent if h["type"] == protocol.PING) == [b"a", b"b"]


# --- shared-memory slots --------------------------------------------------------------------------------------------
@pytest.fixture
def slab():
    if not shm.available():
        cannot_run("memfd_create and /proc are needed for the shared-memory slab")
    slab = shm.Slab(4, 4096)
    yield slab
    slab.close()


def test_a_lost_producer_s_slot_comes_back_only_once_its_process_exited(slab):
    loop = Loop(capacity=2, slab=slab)
    loop.hello(b"a", slots=2, pid=4242, shm_token=slab.token)
    loop.start()
    slotted = [t for t in loop.tasks(b"a") if "slot" in t]
    assert len(slotted) == 2 and slab.free == 2
    loop.tick(5.0)  # silent: lost while it may still be writing into both slots
    assert b"a" not in loop.core.dispatcher.producers
    assert loop.core.slots.holders() == {4242} and slab.free == 2  # set aside, not reused
    loop.tick(1.0, exited=())
    assert slab.free == 2
    loop.tick(1.0, exited={4242})
    assert slab.free == 4 and loop.core.slots.lost == 0


def test_a_slot_goes_back_when_its_batch_is_dropped_and_a_fail_frees_it_at_once(slab):
    loop = Loop(capacity=2, slab=slab)
    loop.hello(b"a", slots=2, shm_token=slab.token)
    loop.start()
    first, second = loop.tasks(b"a")
    assert "slot" in first and "slot" in second and slab.free == 2
    loop.fail(b"a", second)
    assert slab.free == 3  # a FAIL wrote nothing it needs
    loop.answer(b"a", first, slab=slab)
    assert loop.core.counters.shared_batches == 1
    taken = loop.take()  # its credit back: the next task takes a slot too
    assert "slot" in loop.tasks(b"a")[-1] and slab.free == 2  # one leased to the batch, whose views are the slot
    assert taken.tree.tolist() == [0.0]
    del taken
    gc.collect()
    assert slab.free == 3


def test_a_remote_producer_is_never_lent_a_slot(slab):
    loop = Loop(capacity=2, slab=slab)
    loop.hello(b"r", slots=2, shm_token="not-the-token")
    loop.start()
    assert all("slot" not in t for t in loop.tasks(b"r")) and slab.free == 4


def test_a_producer_asked_to_stop_is_not_admitted_again_before_it_exits():
    """A scale-down lets a local producer go first (no attempt charged), then stops it. Told "say HELLO" in
    between (its next PING reaches a consumer that no longer knows it), it must not be admitted again: its
    socket closes a moment later, and a TASK sent to it would cost an attempt ("unreachable")."""
    loop = Loop(capacity=2, max_attempts=1)
    loop.hello(b"a", slots=1, pid=7)
    loop.hello(b"b", slots=1, pid=8)
    loop.start()
    loop.apply(loop.core.producer_leaving("h:7", loop.now))
    assert b"a" not in loop.core.dispatcher.producers
    loop.receive(b"a", {"type": protocol.PING, "load": {}})
    loop.hello(b"a", slots=1, pid=7, nonce=2)  # what it does when told to say HELLO
    assert b"a" not in loop.core.dispatcher.producers
    refusal = [h for p, h, _ in loop.sent if p == b"a" and h["type"] == protocol.REJECT and h["permanent"]]
    assert refusal and "asked to stop" in refusal[-1]["reason"]
    assert all(t["task"] not in loop.core.dispatcher.tasks for t in loop.tasks(b"a"))  # nothing held there


# --- what survivors of .ci/mutation showed unpinned -----------------------------------------------------------------
def test_a_message_without_a_header_frame_is_invalid_and_each_one_counts():
    loop = Loop()
    for _ in range(3):
        loop.apply(loop.core.received([b"x"], loop.now))  # a routing id alone
    assert loop.counters.invalid_messages == 3 and loop.sent == []


def test_pickled_values_are_allowed_only_to_a_same_user_ipc_producer():
    """WELCOME's ``pickle``: only a producer whose ipc link's kernel credentials are this process's user may send
    pickled values; a tcp one (even over loopback) or one of another user never is told it may."""
    loop = Loop()
    uid, gid = os.getuid(), os.getgid()
    for peer, address in [(b"ipc", f"/run/ferry/x.sock:{uid}:{gid}:4242"), (b"tcp", "127.0.0.1"),
                          (b"other", f"/run/ferry/x.sock:{uid + 1}:{gid}:4243")]:
        hello = dict(type=protocol.HELLO, producer=peer.decode(), nonce=1, host="h", pid=len(loop.sent) + 1, slots=2,
                     dataset={"spec": "s", "len": SAMPLES, "fingerprint": "f"}, v=protocol.PROTOCOL_VERSION)
        loop.apply(loop.core.received([peer, msgpack.packb(hello)], loop.now, address=address))
    welcomes = {p: h for p, h, _ in loop.sent if h["type"] == protocol.WELCOME}
    assert sorted(welcomes) == [b"ipc", b"other", b"tcp"]
    assert welcomes[b"ipc"].get("pickle") is True
    assert "pickle" not in welcomes[b"tcp"] and "pickle" not in welcomes[b"other"]
    assert [p.pickle_ok for p in loop.core.dispatcher.producers.values()] == [True, False, False]


def test_no_progress_is_counted_while_the_consumer_owes_producers_work_and_it_is_when_it_owes_none():
    loop = Loop(capacity=2, length=4)
    loop.start()  # a run, no producer: 4 batches owed to no one
    loop.tick(1.0)
    assert loop.core.peers.progress_at == 0.0, "nothing in flight but work queued: no progress"
    loop.hello(b"a", slots=4)
    assert loop.in_flight() == 2  # the capacity: nothing more to issue now, two tasks owed
    loop.tick(1.0)
    assert loop.core.peers.progress_at == 0.0, "tasks in flight and none answered: no progress"
    answer_all(loop, b"a")
    assert loop.core.peers.progress_at == 2.0  # results arrived
    loop.tick(1.0)  # both held by a training loop that takes nothing: the consumer owes producers nothing
    assert loop.in_flight() == 0 and loop.core.held == 2
    assert loop.core.peers.progress_at == 3.0, "waiting on the training loop, not on producers: progress"


def test_a_result_of_an_unregistered_peer_is_a_duplicate_in_this_session_and_stale_from_another():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=2)
    loop.start()
    first, second = loop.tasks(b"a")
    loop.receive(b"a", {"type": protocol.BYE})  # its tasks go back to the queue; its late answers are strangers'
    loop.answer(b"a", first)
    assert (loop.counters.duplicates, loop.counters.stale) == (1, 0)
    loop.answer(b"a", dict(second, session=5))  # a previous consumer's session
    assert (loop.counters.duplicates, loop.counters.stale) == (1, 1) and loop.delivered == []


def test_a_producer_announcing_a_sharded_dataset_makes_the_consumer_sharded():
    loop = Loop()
    loop.receive(b"a", dict(type=protocol.HELLO, producer="a", nonce=1, host="h", pid=1, slots=2,
                            dataset={"spec": "s", "len": 3, "fingerprint": "f", "sharded": True}))
    assert any(h["type"] == protocol.WELCOME for _, h, _ in loop.sent)
    assert loop.core.sharded is True and loop.core.peers.dataset_len == 3


def test_a_late_result_counts_as_a_duplicate_each_time():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=2)
    loop.start()
    first, second = loop.tasks(b"a")
    loop.receive(b"a", {"type": protocol.BYE})
    loop.answer(b"a", first)
    loop.answer(b"a", second)
    assert (loop.counters.duplicates, loop.counters.stale) == (2, 0)


def test_a_producer_over_tcp_from_another_host_is_remote_and_a_local_one_is_not():
    """``remote`` decides what "auto" compression may try and whether a slot may be lent (core/compression.py)."""
    loop = Loop()
    for peer, address in [(b"far", "10.1.2.3"), (b"loop", "127.0.0.1"), (b"ipc", "/run/x.sock:0:0:1")]:
        hello = dict(type=protocol.HELLO, producer=peer.decode(), nonce=1, host=peer.decode(), pid=1, slots=2,
                     dataset={"spec": "s", "len": SAMPLES, "fingerprint": "f"}, v=protocol.PROTOCOL_VERSION)
        loop.apply(loop.core.received([peer, msgpack.packb(hello)], loop.now, address=address))
    remote = {p: info.remote for p, info in loop.core.dispatcher.producers.items()}
    assert remote == {b"far": True, b"loop": False, b"ipc": False}


def test_a_weight_other_than_one_is_told_in_the_welcome():
    """A pool producer shares its time by each consumer's ``weight`` (producer/core/sharing.py); 1 goes unsaid."""
    for weight, said in ((2.5, 2.5), (1.0, None)):
        loop = Loop()
        loop.core = ConsumerCore(CoreConfig(capacity=4, heartbeat=1.0, liveness=3, task_timeout=10.0,
                                            on_error="raise", max_batch_bytes=1 << 20, max_attempts=3,
                                            weight=weight), session=77, now=0.0, counters=loop.counters)
        loop.hello(b"a")
        (welcome,) = [h for _, h, _ in loop.sent if h["type"] == protocol.WELCOME]
        assert welcome.get("weight") == said


def test_the_figures_count_producers_seen_and_show_the_slab(slab):
    loop = Loop(slab=slab)
    loop.hello(b"a", pid=1)
    loop.hello(b"b", pid=2)
    loop.receive(b"a", {"type": protocol.BYE})
    figures = loop.core.figures(loop.now)
    assert figures["producers"] == 1 and figures["producers_seen"] == 2
    assert figures["shared_memory"] == {"slots": slab.slots, "free": slab.free, "lost": 0}
    assert Loop().core.figures(0.0)["shared_memory"] is None
