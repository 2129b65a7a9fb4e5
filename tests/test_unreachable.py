"""Producers say where they are stuck (issue 11, item 6): a real producer pointed at a host that does not
resolve keeps warning, with back-off, and names the DNS failure."""

from __future__ import annotations

from .helpers import wait_for


def test_a_producer_pointed_at_a_name_that_does_not_resolve_says_so_and_keeps_warning(spawn, monkeypatch):
    monkeypatch.setenv("FERRY_UNREACHABLE_WARNING_S", "0.3")  # warnings after 0.3, 0.9, 1.8 s, then every 9 s
    producer = spawn("tcp://no-such-host.invalid:5555", "tests.datasets:PairDataset", {"length": 4}, threads=1)
    wait_for(lambda: producer.output().count("no consumer has answered") >= 3, 30, "three warnings")
    lines = [line for line in producer.output().splitlines() if "no consumer has answered" in line]
    assert all("tcp://no-such-host.invalid:5555" in line for line in lines)
    assert "'no-such-host.invalid' does not resolve (DNS" in lines[-1]
    assert producer.proc.poll() is None  # still trying


def test_a_producer_pointed_at_a_port_nobody_listens_on_warns_without_blaming_dns(spawn, monkeypatch):
    from .helpers import free_port

    monkeypatch.setenv("FERRY_UNREACHABLE_WARNING_S", "0.3")
    producer = spawn(f"tcp://127.0.0.1:{free_port()}", "tests.datasets:PairDataset", {"length": 4}, threads=1)
    wait_for(lambda: producer.output().count("no consumer has answered") >= 2, 30, "two warnings")
    assert "DNS" not in producer.output()
