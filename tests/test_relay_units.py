"""The relay's framing, leaves and core, without sockets (issue 34): the header format and its bounds, a batch's
leaves in the client's order and dtypes, and the core's decisions (hello and its refusals, the window bound,
credits, reconnects, passes, the state a client consumed), checked as events in, actions out, also under a long
random schedule of loads, credits, disconnects and new passes."""

from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
import torch

from ferry.common.constants import RELAY_MAX_HEADER_BYTES, RELAY_PROTOCOL_VERSION
from ferry.common.errors import RelayError
from ferry.consumer.relay.client import _tree
from ferry.consumer.relay.core import RelayCore
from ferry.consumer.relay.events import (
    Close, Done, ErrorReport, Item, LoadState, PassStarted, PullItem, Pulled, RunLoader, Send, SendItem, SendStats,
    SetEpoch, StartPass, Stop,
)
from ferry.consumer.relay.framing import (
    LENGTH, Header, MessageReader, Part, decode_name, encode, encode_name, parse_header, text_parts,
)
from ferry.consumer.relay.leaves import ClientFormat, inline_bytes, leaves_of, wire_dtype

TOKEN = "secret"


# --- framing ---
def test_a_header_round_trips_with_every_kind_of_part():
    parts = [Part("array", "#0", "float32", (2, 3)), Part("array", "s", "int64", ()), Part("text", "t", nbytes=5),
             Part("raw", "r", nbytes=0), Part("null", "#2")]
    data = encode("batch", {"pass": 3, "order": "F", "empty": ""}, parts)
    assert LENGTH.unpack(data[:4])[0] == len(data) - 4
    header = parse_header(data[4:])
    assert header.type == "batch" and header.fields == {"pass": "3", "order": "F", "empty": ""}
    assert header.parts == parts and header.integer("pass") == 3


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"Batch", b"batch\nBad line", b"batch\narray x float128 2",
                                 b"batch\narray x float32 2,a", b"batch\ntext t nine", b"batch\narray x int8"])
def test_a_malformed_header_is_a_relay_error(bad):
    with pytest.raises(RelayError):
        parse_header(bad)


def test_a_reader_takes_messages_split_at_every_byte_and_refuses_an_oversized_header():
    parts, data = text_parts({"state": '{"épo": 1}'})
    stream = encode("load_state", {}, parts) + b"".join(data) + encode("credit", {"n": 1, "pass": 2})
    for cut in range(len(stream) + 1):
        reader = MessageReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [h.type for h, _ in got] == ["load_state", "credit"]
        assert json.loads(got[0][1]["state"].decode()) == {"épo": 1}
    with pytest.raises(RelayError, match="does not speak"):
        MessageReader().feed(LENGTH.pack(RELAY_MAX_HEADER_BYTES + 1))


def test_names_encode_paths_of_dict_keys_and_positions():
    for path in ([], [0], ["x"], [1, "a/b c#%", 2], ["#7"]):
        assert decode_name(encode_name(path)) == path
    assert encode_name([]) == "." and encode_name([0, "x y"]) == "#0/x%20y"


# --- leaves ---
def test_column_major_order_gives_the_batch_index_for_index():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (leaf,) = leaves_of(x, ClientFormat("F", frozenset({"float64"})))
    assert leaf.part.dtype == "float64" and leaf.part.dims == (2, 3, 4) and leaf.part.name == "."
    flat = np.frombuffer(inline_bytes(leaf, "F"), np.float64)
    as_r = flat.reshape((2, 3, 4), order="F")  # what R's array(flat, dim = c(2, 3, 4)) holds
    assert np.array_equal(as_r, x) and flat[1] == x[1, 0, 0]
    (same,) = leaves_of(x, ClientFormat("C"))
    assert same.part.dtype == "float32" and inline_bytes(same, "C").obj is not None
    assert np.shares_memory(np.frombuffer(inline_bytes(same, "C"), np.float32), x)  # no copy when it need not


def test_dtypes_go_to_the_first_wider_one_the_client_reads_and_int64_by_value():
    r = frozenset({"float64", "int32", "uint8", "bool"})
    assert wire_dtype(np.zeros(2, np.float32), r, "x") == "float64"
    assert wire_dtype(np.zeros(2, np.int16), r, "x") == "int32"
    assert wire_dtype(np.array([0, 2**31 - 1]), r, "x") == "int32"
    assert wire_dtype(np.array([0, 2**31]), r, "x") == "float64"
    with pytest.raises(RelayError, match="leaf y"):
        wire_dtype(np.array([2**53 + 1]), frozenset({"float64"}), "y")
    with pytest.raises(RelayError, match="complex"):
        wire_dtype(np.zeros(1, np.complex64), r, "z")
    (leaf,) = leaves_of(torch.ones(2, dtype=torch.bfloat16), ClientFormat("C"))
    assert leaf.part.dtype == "float32"


def test_a_tree_becomes_named_leaves_and_back():
    Pair = collections.namedtuple("Pair", "left right")
    batch = {"image": torch.arange(6).reshape(2, 3), "meta": [Pair(1.5, None), "name", b"\x00\x01"], "flag": True}
    leaves = leaves_of(batch, ClientFormat("C"))
    assert [(leaf.part.kind, leaf.part.name) for leaf in leaves] == [
        ("array", "image"), ("array", "meta/#0/left"), ("null", "meta/#0/right"), ("text", "meta/#1"),
        ("raw", "meta/#2"), ("array", "flag")]
    header = Header("batch", {}, [leaf.part for leaf in leaves])
    parts = {leaf.part.name: (bytes(inline_bytes(leaf, "C")) if leaf.part.kind == "array" else leaf.value)
             for leaf in leaves}
    parts["meta/#1"] = "name"
    back = _tree(header, parts, "C")
    assert np.array_equal(back["image"], np.arange(6).reshape(2, 3))
    assert back["meta"][0] == {"left": 1.5, "right": None} and back["meta"][1:] == ["name", b"\x00\x01"]
    assert back["flag"] == np.array(True)
    with pytest.raises(RelayError, match="cannot travel"):
        leaves_of([object()], ClientFormat("C"))


# --- the core ---
def core(window: int = 2, max_window: int = 4) -> RelayCore:
    return RelayCore(token=TOKEN, max_window=max_window, default_window=window, heartbeat=5.0, hello_timeout=10.0,
                     payload_folder="/dev/shm/x", state={"epoch": 0, "batches_delivered": 0})


def hello(**fields) -> Header:
    return Header("hello", {"version": str(RELAY_PROTOCOL_VERSION), "token": TOKEN, **{k: str(v) for k, v in
                                                                                          fields.items()}})


def admit(c: RelayCore, conn: str = "a", **fields) -> list:
    c.opened(conn, 0.0)
    return c.received(conn, hello(**fields), {}, 0.0)


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def refused(actions: list) -> str:
    (send,) = of(actions, Send)
    assert send.type == "refuse" and of(actions, Close)
    return send.texts["reason"]


def item(pass_no: int, number: int, kind: str = "batch") -> Item:
    return Item(pass_no, number, kind, 0, number if kind == "batch" else -1, {"epoch": 0, "batches_delivered":
                                                                               number + 1}, tree=number)


def test_a_client_of_another_version_is_refused_naming_both_versions():
    c = core()
    c.opened("a", 0.0)
    reason = refused(c.received("a", Header("hello", {"version": "2", "token": TOKEN}), {}, 0.0))
    assert f"version {RELAY_PROTOCOL_VERSION}, the client version 2" in reason
    c.opened("b", 0.0)
    assert "no version line" in refused(c.received("b", Header("hello", {"token": TOKEN}), {}, 0.0))
    c.opened("c", 0.0)
    assert "wrong token" in refused(c.received("c", hello(token="guess"), {}, 0.0))
    c.opened("d", 0.0)
    assert "first message must be a hello" in refused(c.received("d", Header("iter"), {}, 0.0))
    c.opened("e", 0.0)
    assert "order must be C or F" in refused(c.received("e", hello(order="X"), {}, 0.0))
    assert c.client is None and c.figures["refused"] == 5


def test_one_client_at_a_time_and_a_silent_connection_is_closed():
    c = core()
    welcome = of(admit(c, "a", window=9), Send)[0]
    assert welcome.type == "welcome" and welcome.fields["window"] == 4  # capped at buffer_batches
    assert "one client at a time" in refused(admit(c, "b"))
    c.opened("slow", 0.0)
    assert "no hello within" in refused([a for a in c.tick(10.5) if a.conn == "slow"])


def test_the_loader_is_never_asked_past_the_window_and_credits_let_it_go_on():
    c = core(window=2)
    admit(c)
    actions = c.received("a", Header("iter"), {}, 0.0)
    assert of(actions, RunLoader)[0].command == StartPass(1)
    actions = c.answered(PassStarted(1, 0, 0, 10, {"epoch": 0, "batches_delivered": 0}), 0.0)
    assert of(actions, Send)[0].type == "pass" and of(actions, RunLoader)[0].command == PullItem(1, 0)
    actions = c.answered(Pulled(item(1, 0)), 0.0)
    assert of(actions, SendItem)[0].item.number == 0 and of(actions, RunLoader)[0].command == PullItem(1, 1)
    actions = c.answered(Pulled(item(1, 1)), 0.0)
    assert of(actions, SendItem) and not of(actions, RunLoader)  # held 2 = window: no pull
    actions = c.received("a", Header("credit", {"n": "1", "pass": "1"}), {}, 0.0)
    assert of(actions, RunLoader)[0].command == PullItem(1, 2)
    assert c.state == {"epoch": 0, "batches_delivered": 1}  # what the client consumed, exactly
    assert not c.received("a", Header("credit", {"n": "1", "pass": "7"}), {}, 0.0)  # another pass's: ignored


def test_a_reconnecting_client_gets_what_it_did_not_consume_and_a_new_one_goes_on_where_the_last_was():
    c = core(window=3, max_window=3)
    admit(c)
    c.received("a", Header("iter"), {}, 0.0)
    c.answered(PassStarted(1, 0, 0, 10, {}), 0.0)
    for n in range(3):
        c.answered(Pulled(item(1, n)), 0.0)
    c.received("a", Header("credit", {"n": "1", "pass": "1"}), {}, 0.0)
    c.closed("a", 1.0)  # item 1 was consumed too, but its credit never came
    actions = admit(c, "b", **{"pass": 1, "consumed": 2})
    assert of(actions, Send)[0].fields["consumed"] == 2
    assert [a.item.number for a in of(actions, SendItem)] == [2]
    c.closed("b", 2.0)
    actions = admit(c, "c")  # a new client (a new R process): every item not consumed, in order
    assert [a.item.number for a in of(actions, SendItem)] == [2] and c.client.sent == 1


def test_iter_abandons_the_pass_and_waits_for_a_running_pull():
    c = core()
    admit(c)
    c.received("a", Header("iter"), {}, 0.0)
    c.answered(PassStarted(1, 0, 0, 10, {}), 0.0)  # pull 0 runs
    assert not of(c.received("a", Header("iter"), {}, 0.0), RunLoader)  # waits for the pull
    actions = c.answered(Pulled(item(1, 0)), 0.0)
    assert of(actions, RunLoader)[0].command == StartPass(2) and not c.held
    assert c.answered(PassStarted(2, 0, 0, 10, {}), 0.0)[0].fields["pass"] == 2
    assert not c._pulled(item(1, 5), 0.0)  # a late item of the old pass is dropped


def test_commands_reply_in_order_and_the_state_stays_the_pass_position_mid_pass():
    c = core()
    admit(c)
    c.received("a", Header("iter"), {}, 0.0)
    c.answered(PassStarted(1, 0, 0, 10, {"epoch": 0, "batches_delivered": 0}), 0.0)
    c.answered(Pulled(item(1, 0)), 0.0)
    c.received("a", Header("credit", {"n": "1", "pass": "1"}), {}, 0.0)
    c.received("a", Header("set_epoch", {"epoch": "4"}), {}, 0.0)  # waits for the pull of item 1
    actions = c.answered(Pulled(item(1, 1)), 0.0)
    assert of(actions, RunLoader)[0].command == SetEpoch(4)
    actions = c.answered(Done("set_epoch", {"epoch": 4, "batches_delivered": 0}), 0.0)
    assert of(actions, Send)[0].type == "ok" and c.state == {"epoch": 0, "batches_delivered": 1}
    state = c.received("a", Header("state"), {}, 0.0)[0]
    assert json.loads(state.texts["state"]) == {"epoch": 0, "batches_delivered": 1}
    error = [a for a in c.received("a", Header("load_state"), {"state": "{oops"}, 0.0) if isinstance(a, Send)][0]
    assert error.type == "error" and error.fields["reply"] == "load_state" and "not JSON" in error.texts["message"]
    c.received("a", Header("load_state"), {"state": '{"epoch": 9}'}, 0.0)
    assert [command for _, _, command in c.pending] == [LoadState({"epoch": 9})]  # after the running pull


def test_an_error_of_a_command_is_its_reply_and_after_the_end_a_command_sets_the_state():
    c = core()
    admit(c)
    c.received("a", Header("iter"), {}, 0.0)
    report = ErrorReport("NoProducersError", ("NoProducersError", "FerryError", "TimeoutError"), "none", "tb")
    actions = c.answered(PassStarted(1, 0, 0, -1, {}, report), 0.0)
    (error,) = of(actions, Send)
    assert error.type == "error" and error.fields["reply"] == "iter" and error.texts["traceback"] == "tb"
    assert not of(actions, RunLoader)  # nothing to pull: the pass did not start
    c.received("a", Header("load_state"), {"state": '{"epoch": 3}'}, 0.0)
    c.answered(Done("load_state", {"epoch": 3, "batches_delivered": 5}), 0.0)
    assert c.state == {"epoch": 3, "batches_delivered": 5}


def test_a_malformed_command_closes_that_connection_and_the_relay_goes_on():
    c = core()
    admit(c)
    assert "invalid credit" in refused(c.received("a", Header("credit", {"pass": "1"}), {}, 0.0))
    assert c.client is None
    assert of(admit(c, "b"), Send)[0].type == "welcome"  # the next client is served


def test_pings_stats_and_bye_with_stop():
    c = core()
    admit(c)
    assert not c.tick(4.0) and of(c.tick(5.0), Send)[0].type == "ping"
    assert isinstance(c.received("a", Header("stats"), {}, 6.0)[0], SendStats)
    actions = c.received("a", Header("bye", {"stop": "1"}), {}, 6.0)
    assert of(actions, Close) and of(actions, Stop) and c.client is None


def test_a_long_random_schedule_keeps_the_window_and_delivers_every_item_once_in_order():
    """A simulated relay: a loader that answers after random delays, a client that consumes, disconnects (with or
    without saying where it was), starts passes. Checked at every step: held + a running pull <= window; what the
    client consumes of a pass is exactly its items 0, 1, 2 ... (through reconnects), and the state follows it."""
    rng = random.Random(34)
    seen = collections.Counter()
    for trial in range(30):
        window = rng.randint(1, 4)
        c = core(window=window, max_window=4)
        length = rng.randint(1, 12)
        pending: list = []  # the loader's command, answered some steps later
        inbox: list = []  # items sent to the client, not consumed
        consumed: list = []
        conn, conns = "c0", 0
        actions = admit(c, conn, window=window) + c.received(conn, Header("iter"), {}, 0.0)
        for step in range(400):
            for action in actions:
                if isinstance(action, RunLoader):
                    pending.append(action.command)
                elif isinstance(action, SendItem) and action.conn == conn:
                    inbox.append(action.item)
            assert len(c.held) + (1 if isinstance(c.busy and c.busy[2], PullItem) else 0) <= c.window
            roll = rng.random()
            if pending and roll < 0.4:
                command = pending.pop(0)
                if isinstance(command, StartPass):
                    consumed = []
                    actions = c.answered(PassStarted(command.pass_no, 0, 0, length, {"at": 0}), step)
                else:
                    n = command.number
                    kind = "end" if n == length else "batch"
                    answer = Item(command.pass_no, n, kind, 0, n, {"at": n + 1}, tree=n)
                    actions = c.answered(Pulled(answer), step)
            elif inbox and roll < 0.75:
                got = inbox.pop(0)
                if got.pass_no == c.pass_no:
                    consumed.append(got.number)
                    seen["consumed after a reconnect" if conns else "consumed"] += 1
                    actions = c.received(conn, Header("credit", {"n": "1", "pass": str(got.pass_no)}), {}, step)
                    assert c.state == {"at": got.number + 1}
                else:
                    actions = []
            elif roll < 0.8:
                keep = rng.random() < 0.5  # the same client (it knows where it was), or a new one
                c.closed(conn, step)
                conns += 1
                conn = f"c{conns}"
                inbox = []
                fields = {"window": window}
                if keep:
                    fields.update({"pass": c.pass_no, "consumed": len(consumed)})
                actions = admit(c, conn, **fields)
            elif roll < 0.82 and not pending:
                actions = c.received(conn, Header("iter"), {}, step)
            else:
                actions = []
            assert consumed == list(range(len(consumed))), (trial, step, consumed)
        seen["passes"] += c.pass_no
    assert seen["consumed after a reconnect"] > 100 and seen["passes"] > 30, seen  # the schedule did explore
