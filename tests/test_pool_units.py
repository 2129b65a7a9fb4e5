"""The pool's protocol rule without sockets (common/pool.py): what a consumer answers to a HELLO, what a WELCOME
may name, how a producer's connection opens the dataset a consumer names and announces it, and how the consumer's
admission names its dataset without registering the producer until it is announced."""

from __future__ import annotations

import itertools
import logging

import msgpack
import pytest

from ferry.common import protocol
from ferry.common.errors import ProtocolError
from ferry.common.pool import ADMIT, NAME, REJECT, answer_hello, dataset_key, named_dataset, valid_named
from ferry.consumer.core.admission import Peers
from ferry.consumer.core.dispatcher import Dispatcher
from ferry.producer.core.connection import Connection, Log, OpenDataset, Phase, SendHello
from tests.helpers import welcome_fields

NONE = {"spec": "", "len": 0, "fingerprint": ""}


def hello(dataset=None, *, pool=True, producer="p", nonce=1, **extra) -> dict:
    return dict(producer=producer, nonce=nonce, host="h", pid=7, slots=2,
                dataset=dataset if dataset is not None else dict(NONE), **({"pool": True} if pool else {}), **extra)


def served(spec, length=10, fingerprint="f", args=None) -> dict:
    return {"spec": spec, "len": length, "fingerprint": fingerprint, **({"args": args} if args is not None else {})}


# --- the rule ----------------------------------------------------------------------------------------------
def test_a_consumer_names_its_spec_to_a_pool_that_announces_another_or_none():
    assert answer_hello(hello(), "synthetic", {"length": 4}) == (NAME, "")
    assert answer_hello(hello(served("packed")), "synthetic", {}) == (NAME, "")
    # announced with other arguments (opened for an earlier consumer on this connection): named again
    assert answer_hello(hello(served("synthetic", args={"length": 5})), "synthetic", {"length": 4}) == (NAME, "")


def test_the_very_dataset_named_is_admitted_and_a_producers_own_spec_is_admitted_as_before():
    assert answer_hello(hello(served("synthetic", args={"length": 4})), "synthetic", {"length": 4}) == (ADMIT, "")
    # the producer's own --dataset (no args echoed): admitted on its spec, arguments not compared, as before
    assert answer_hello(hello(served("synthetic")), "synthetic", {"length": 4}) == (ADMIT, "")
    assert answer_hello(hello(served("synthetic"), pool=False), "synthetic", None) == (ADMIT, "")


def test_a_consumer_naming_none_is_served_a_producers_own_dataset_and_refused_by_one_without():
    assert answer_hello(hello(served("x:y")), None, None) == (ADMIT, "")
    verdict, why = answer_hello(hello(), None, None)
    assert verdict == REJECT and "without --dataset" in why and "RemoteLoader(dataset=" in why


def test_a_refusal_becomes_a_permanent_reject_naming_the_consumers_spec_and_the_producers_reason():
    verdict, why = answer_hello(hello(refused="not allowed here: a.b:c"), "m:ds", {})
    assert verdict == REJECT and "dataset='m:ds'" in why and "not allowed here: a.b:c" in why


def test_a_producer_that_is_no_pool_serving_another_spec_is_rejected_as_before():
    verdict, why = answer_hello(hello(served("other:ds"), pool=False), "s", None)
    assert verdict == REJECT and "'other:ds'" in why and "dataset='s'" in why


def test_one_key_per_distinct_spec_and_arguments_whatever_their_order():
    assert dataset_key("s", {"a": 1, "b": [2]}) == dataset_key("s", {"b": [2], "a": 1})
    assert dataset_key("s", {}) == dataset_key("s", None) != dataset_key("s", {"a": 1}) != dataset_key("t", {"a": 1})


# --- the messages ------------------------------------------------------------------------------------------
def test_a_welcome_may_name_a_dataset_and_a_weight_and_both_are_validated():
    header = protocol.pack(protocol.WELCOME, session=1, heartbeat=1.0, nonce=2, dataset=named_dataset("s", {"n": 3}),
                           weight=2.5, **welcome_fields())
    parsed = protocol.parse_header(header)
    assert parsed["dataset"] == {"spec": "s", "args": {"n": 3}} and parsed["weight"] == 2.5
    for bad in ({"spec": "", "args": {}}, {"spec": "s"}, {"spec": "s", "args": {1: 2}}, {"spec": "s", "args": [],},
                {"spec": "s", "args": {}, "more": 1}, "s"):
        with pytest.raises(ProtocolError, match="'dataset'"):
            protocol.parse_header(protocol.pack(protocol.WELCOME, session=1, heartbeat=1.0, nonce=2, dataset=bad,
                                                **welcome_fields()))
    for weight in (0, -1, 1001, True, "2"):
        with pytest.raises(ProtocolError, match="'weight'"):
            protocol.parse_header(protocol.pack(protocol.WELCOME, session=1, heartbeat=1.0, nonce=2, weight=weight,
                                                **welcome_fields()))
    assert not valid_named({"spec": "s", "args": {"b": b"bytes"}})  # no JSON form: not a dataset argument


def test_a_hello_may_say_pool_refused_and_the_args_it_was_opened_with():
    header = protocol.pack(protocol.HELLO, **hello(served("s", args={"n": 1}), refused="why"))
    parsed = protocol.parse_header(header)
    assert parsed["pool"] is True and parsed["refused"] == "why" and parsed["dataset"]["args"] == {"n": 1}
    with pytest.raises(ProtocolError, match="'dataset'"):
        protocol.parse_header(protocol.pack(protocol.HELLO, **hello(served("s", args=[1]))))
    with pytest.raises(ProtocolError, match="'pool'"):
        protocol.parse_header(msgpack.packb(protocol.make_header(protocol.HELLO, **dict(hello(), pool=1))))


# --- the producer's connection -------------------------------------------------------------------------------
def connection() -> Connection:
    nonces = itertools.count(1)
    return Connection("tcp://trainer:5555", now=0.0, heartbeat=1.0, liveness=3, unreachable_warning_s=10.0,
                      dataset_len=0, new_nonce=lambda: next(nonces))


def welcome(conn: Connection, **extra) -> dict:
    return protocol.make_header(protocol.WELCOME, session=0xA, heartbeat=1.0, nonce=conn.nonce, **welcome_fields(),
                                **extra)


def test_a_welcome_naming_a_dataset_opens_it_and_the_same_nonce_announces_it_before_serving():
    conn = connection()
    nonce = conn.nonce
    actions = conn.receive(welcome(conn, dataset=named_dataset("synthetic", {"length": 8})), 1, now=1.0)
    assert actions == [OpenDataset("synthetic", {"length": 8})] and conn.phase is Phase.GREETING
    assert conn.dataset_bound(8, None, now=1.1) == [SendHello(nonce)]  # at once, not a heartbeat later
    assert conn.dataset_len == 8 and conn.phase is Phase.GREETING
    # the consumer admits the HELLO that announces it: a plain WELCOME
    conn.receive(welcome(conn), 1, now=1.2)
    assert conn.serving and conn.nonce == nonce


def test_a_refused_dataset_is_logged_and_said_in_the_next_hello_and_a_permanent_reject_closes():
    conn = connection()
    conn.receive(welcome(conn, dataset=named_dataset("m:ds", {})), 1, now=1.0)
    actions = conn.dataset_bound(0, "not allowed", now=1.1)
    assert actions[-1] == SendHello(conn.nonce) and isinstance(actions[0], Log)
    assert actions[0].level == logging.ERROR and "not allowed" in actions[0].message
    conn.receive(protocol.make_header(protocol.REJECT, reason="cannot serve", permanent=True), 1, now=1.2)
    assert conn.closed


def test_a_connection_keeps_the_dataset_it_was_bound_to_across_a_consumer_restart():
    conn = connection()
    conn.receive(welcome(conn, dataset=named_dataset("synthetic", {})), 1, now=1.0)
    conn.dataset_bound(5, None, now=1.0)
    conn.receive(welcome(conn), 1, now=1.1)
    conn.receive(protocol.make_header(protocol.BYE), 1, now=2.0)  # the consumer left
    assert conn.phase is Phase.GREETING and conn.dataset_len == 5


# --- the consumer's admission ----------------------------------------------------------------------------------
def test_the_consumer_names_its_dataset_without_registering_and_admits_its_announcement():
    peers = Peers(Dispatcher(10, max_attempts=3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0,
                  dataset_spec="synthetic", dataset_args={"length": 8})
    first = peers.admit(b"a", hello(), now=1.0)
    assert first.naming and first.reject is None and not peers.dispatcher.producers and not peers.dataset_known
    second = peers.admit(b"a", hello(served("synthetic", 8, "fp", {"length": 8})), now=1.1)
    assert second.joined is not None and (peers.dataset_len, peers.fingerprint) == (8, "fp")
    refused = peers.admit(b"b", hello(refused="not allowed: none", producer="q"), now=1.2)
    assert refused.refused and "not allowed: none" in refused.reject and "not allowed: none" in peers.refused


def test_a_consumer_sending_invalid_messages_loses_its_session_at_the_bound_and_only_then():
    from ferry.common.constants import MAX_INVALID_FROM_CONSUMER

    conn = connection()
    conn.receive(welcome(conn), 1, now=1.0)
    nonce = conn.nonce
    for _ in range(MAX_INVALID_FROM_CONSUMER - 1):
        assert conn.invalid(now=2.0) == []
    actions = conn.invalid(now=2.0)
    assert conn.phase is Phase.GREETING and conn.nonce != nonce and conn.pending == 0
    assert isinstance(actions[0], Log) and actions[0].level == logging.WARNING and "invalid messages" in actions[0].message
    assert conn.invalid(now=2.1) == []  # greeting: nothing to drop
    conn.receive(welcome(conn), 1, now=3.0)  # a new session starts counting afresh
    assert conn.invalid(now=3.1) == [] and conn.serving


# --- RemoteLoader(weight=) -------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [0, -1, 1001, "2", True, float("nan")])
def test_a_weight_outside_0_to_1000_is_refused_before_anything_starts_naming_the_keyword(weight):
    from ferry import RemoteLoader
    from ferry.common.errors import ConfigError

    with pytest.raises(ConfigError, match="^weight must be a (finite )?number"):
        RemoteLoader(dataset_len=4, weight=weight)


def test_the_weight_is_a_documented_transport_option_of_default_1():
    from ferry.consumer.options.groups import TransportOptions

    assert TransportOptions().weight == 1.0 and TransportOptions(weight=3).weight == 3.0
    assert "weight" in (TransportOptions.__doc__ or "")  # documented with the other options


# --- the consumer core: what goes out ----------------------------------------------------------------------------
def test_the_core_welcomes_a_pool_naming_its_dataset_then_admits_its_announcement_with_its_weight():
    from ferry.consumer.core import ConsumerCore, CoreConfig, Send
    from ferry.consumer.figures.counters import Counters

    core = ConsumerCore(CoreConfig(capacity=4, heartbeat=1.0, liveness=3, task_timeout=10.0, on_error="raise",
                                   max_batch_bytes=1 << 20, max_attempts=3, dataset_spec="synthetic",
                                   dataset_args={"length": 8}, weight=2.0),
                        session=9, now=0.0, counters=Counters())

    def said(actions) -> list[dict]:
        return [protocol.parse_header(a.frames[0]) for a in actions if isinstance(a, Send)]

    first = said(core.received([b"p", protocol.pack(protocol.HELLO, **hello())], now=1.0))
    assert [m["type"] for m in first] == ["WELCOME"] and first[0]["dataset"] == {"spec": "synthetic",
                                                                                  "args": {"length": 8}}
    assert "weight" not in first[0] and not core.dispatcher.producers  # named, not admitted
    announced = hello(served("synthetic", 8, "fp", {"length": 8}))
    second = said(core.received([b"p", protocol.pack(protocol.HELLO, **announced)], now=1.1))
    assert second[0]["type"] == "WELCOME" and "dataset" not in second[0] and second[0]["weight"] == 2.0
    assert list(core.dispatcher.producers) == [b"p"] and core.peers.dataset_len == 8
    core.load = {"needed": 3, "stall": 0.5}  # as the io thread's report_load sets it: every PING carries it
    pings = said(core.tick(now=1.5))
    assert pings and all(m["type"] == "PING" and m["load"] == {"needed": 3, "stall": 0.5} for m in pings)
