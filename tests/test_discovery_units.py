"""The discovery state machine (producer/core/discovery.py) without sockets or DNS: which consumer connections a
producer holds for its endpoints, as the names behind them change."""

from __future__ import annotations

import logging

import pytest

from ferry.producer.core import discovery as discovery_module
from ferry.producer.core.actions import Log
from ferry.producer.core.discovery import CloseLink, Discovery, OpenLink, Resolve, named_host


def make(*endpoints: str, interval: float = 10.0, warning_s: float = 10.0) -> Discovery:
    return Discovery(tuple(endpoints), interval=interval, warning_s=warning_s, now=0.0)


def links(actions) -> tuple[set[str], set[str]]:
    """The urls opened and closed by ``actions``."""
    return ({a.url for a in actions if isinstance(a, OpenLink)}, {a.url for a in actions if isinstance(a, CloseLink)})


def test_addresses_and_ipc_are_fixed_connections_and_names_are_looked_up():
    d = make("tcp://10.0.0.1:5555", "ipc:///tmp/x.sock", "tcp://trainers:5555", "tcp://[::1]:6000")
    actions = d.start()
    assert links(actions) == ({"tcp://10.0.0.1:5555", "ipc:///tmp/x.sock", "tcp://[::1]:6000"}, set())
    assert {a.address for a in actions if isinstance(a, OpenLink)} == {""}  # their HELLOs say the producer's id
    assert [a for a in actions if isinstance(a, Resolve)] == [Resolve("trainers")]
    assert d.unresolved  # trainers has no address yet


def test_with_interval_zero_a_name_is_one_fixed_connection_as_before():
    d = make("tcp://trainers:5555", interval=0)
    assert d.start() == [OpenLink("tcp://trainers:5555", "tcp://trainers:5555")]
    assert not d.unresolved and d.wait_s(0.0) == float("inf")


def test_a_name_gets_one_connection_per_address_and_follows_them_as_they_change():
    d = make("tcp://trainers:5555")
    d.start()
    opened, closed = links(d.resolved("trainers", ("10.0.0.2", "10.0.0.1"), None, now=0.1))
    assert opened == {"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"} and not closed
    labels = {a.label for a in d.resolved("trainers", ("10.0.0.9", "10.0.0.1", "10.0.0.2"), None, now=0.2)
              if isinstance(a, OpenLink)}
    assert labels == {"tcp://10.0.0.9:5555 (trainers)"}
    assert {a.address for a in d.resolved("trainers", ("10.0.0.7",), None, now=0.25) if isinstance(a, OpenLink)} == {
        "10.0.0.7"}  # its HELLO says the producer's id and /10.0.0.7
    d.resolved("trainers", ("10.0.0.9", "10.0.0.1", "10.0.0.2"), None, now=0.3)
    assert not d.unresolved
    # not due before the interval; then one lookup, not one per tick
    assert [a for a in d.tick(5.0) if isinstance(a, Resolve)] == []
    assert [a for a in d.tick(10.3) if isinstance(a, Resolve)] == [Resolve("trainers")]
    assert [a for a in d.tick(10.4) if isinstance(a, Resolve)] == []
    actions = d.resolved("trainers", ("10.0.0.1", "10.0.0.3"), None, now=10.5)
    assert links(actions) == ({"tcp://10.0.0.3:5555"}, {"tcp://10.0.0.2:5555", "tcp://10.0.0.9:5555"})
    said = [a.message for a in actions if isinstance(a, Log)]
    assert said == ["'trainers' resolves to 10.0.0.1, 10.0.0.3 (2 consumer connections; joining 10.0.0.3; "
                    "leaving 10.0.0.2, 10.0.0.9)"]
    why = {a.why for a in actions if isinstance(a, CloseLink)}
    assert why == {"'trainers' no longer resolves to 10.0.0.2", "'trainers' no longer resolves to 10.0.0.9"}
    assert d.resolved("trainers", ("10.0.0.3", "10.0.0.1"), None, now=20.6) == []  # the same: nothing to say


def test_a_failed_lookup_keeps_the_connections_and_an_empty_answer_closes_them():
    d = make("tcp://trainers:5555")
    d.start()
    d.resolved("trainers", ("10.0.0.1",), None, now=0.1)
    actions = d.resolved("trainers", None, "its host 'trainers' does not resolve (DNS: Temporary failure)", now=10.2)
    assert links(actions) == (set(), set())
    assert [a.level for a in actions] == [logging.WARNING] and "keeping its 1 consumer connections" in actions[0].message
    actions = d.resolved("trainers", (), "its host 'trainers' does not resolve (DNS: Name or service not known)",
                         now=20.3)
    assert links(actions) == (set(), {"tcp://10.0.0.1:5555"})
    assert d.unresolved


def test_a_port_range_on_a_name_is_one_lookup_and_a_connection_per_address_and_port():
    d = make("tcp://trainers:5555", "tcp://trainers:5556")
    assert [a for a in d.start() if isinstance(a, Resolve)] == [Resolve("trainers")]
    opened, _ = links(d.resolved("trainers", ("10.0.0.1", "10.0.0.2"), None, now=0.1))
    assert opened == {f"tcp://10.0.0.{h}:{p}" for h in (1, 2) for p in (5555, 5556)}


def test_an_address_two_names_share_is_one_connection_until_neither_wants_it():
    d = make("tcp://a:5555", "tcp://b:5555", "tcp://10.0.0.1:5555")
    assert links(d.start()) == ({"tcp://10.0.0.1:5555"}, set())
    assert links(d.resolved("a", ("10.0.0.1", "10.0.0.2"), None, now=0.1)) == ({"tcp://10.0.0.2:5555"}, set())
    assert links(d.resolved("b", ("10.0.0.2",), None, now=0.1)) == (set(), set())
    assert links(d.resolved("a", (), "gone", now=10.2)) == (set(), set())  # b still wants .2, the fixed one .1
    assert links(d.resolved("b", (), "gone", now=10.2)) == (set(), {"tcp://10.0.0.2:5555"})


def test_a_name_without_address_warns_with_back_off_naming_the_dns_failure():
    d = make("tcp://trainers:5555", "tcp://trainers:5556", warning_s=1.0)
    d.start()
    d.resolved("trainers", (), "its host 'trainers' does not resolve (DNS: Name or service not known)", now=0.1)
    warned = []
    for step in range(1, 200):  # 0.05 s ticks over 10 s: warnings after 1, 3 and 6 s, then every 30 s
        warned += [a for a in d.tick(step * 0.05) if isinstance(a, Log) and a.level == logging.WARNING]
    assert len(warned) == 3
    assert warned[0].message.startswith("no consumer has answered at tcp://trainers:5555, tcp://trainers:5556 for 1 s; "
                                        "its host 'trainers' does not resolve (DNS: Name or service not known); "
                                        "still trying (next warning after 3 s)")
    assert warned[0].fields["event"] == "unreachable"
    # once it resolves, no more warnings; when the last address goes, the back-off starts over
    d.resolved("trainers", ("10.0.0.1",), None, now=10.0)
    assert not [a for a in d.tick(100.0) if isinstance(a, Log) and a.level == logging.WARNING]
    d.resolved("trainers", (), "gone", now=100.0)
    assert not [a for a in d.tick(100.5) if isinstance(a, Log) and a.level == logging.WARNING]
    assert [a for a in d.tick(101.1) if isinstance(a, Log) and a.level == logging.WARNING]


def test_a_name_with_too_many_addresses_gets_connections_up_to_the_bound(monkeypatch):
    monkeypatch.setattr(discovery_module, "MAX_ADDRESSES_PER_NAME", 2)
    d = make("tcp://trainers:5555")
    d.start()
    actions = d.resolved("trainers", ("10.0.0.3", "10.0.0.1", "10.0.0.2"), None, now=0.1)
    assert links(actions) == ({"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"}, set())
    assert any("connecting to the first 2 only" in a.message for a in actions if isinstance(a, Log))


def test_wait_is_the_time_to_the_next_lookup():
    d = make("tcp://trainers:5555", interval=4.0)
    d.start()
    assert d.wait_s(0.0) == float("inf")  # the first lookup is in flight
    d.resolved("trainers", ("10.0.0.1",), None, now=1.0)
    assert d.wait_s(2.0) == pytest.approx(3.0) and d.wait_s(9.0) == 0.0


@pytest.mark.parametrize("endpoint, host", [
    ("tcp://trainers:5555", "trainers"), ("tcp://eth0;trainers:5555", "trainers"), ("tcp://10.0.0.1:5555", None),
    ("tcp://[::1]:5555", None), ("ipc:///tmp/x", None), ("tcp://my-svc.ns.svc.cluster.local:1", "my-svc.ns.svc.cluster.local"),
])
def test_which_hosts_are_names(endpoint, host):
    assert named_host(endpoint) == host
