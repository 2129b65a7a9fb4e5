"""The optional Prometheus endpoints of the consumer and the producer, scraped for real."""

import urllib.request

import pytest

from tests import needs

from ferry import RemoteLoader

from .helpers import LeakCheck, free_port, wait_for

needs.module("prometheus_client", "metrics")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the scrape")


def metric_type(text: str, name: str) -> str:
    """The ``# TYPE`` of a metric (a counter's line names it with or without ``_total``, by client version)."""
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("# TYPE ") and parts[2] in (name, name + "_total"):
            return parts[3]
    raise AssertionError(f"no TYPE line for {name}")


def test_consumer_and_producer_metrics_are_scraped(endpoint, spawn):
    producer_port, consumer_port = free_port(), free_port()
    spawn(endpoint, "synthetic", {"length": 40, "shape": [4]}, extra=["--metrics-port", str(producer_port)])
    check = LeakCheck()
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, metrics_port=consumer_port) as loader:
        assert len(list(loader)) == 10
        text = scrape(consumer_port)
        assert value(text, "ferry_consumer_batches_total") == 10
        assert value(text, "ferry_consumer_producers") == 1
        assert value(text, "ferry_producers_connected") == 1  # the unprefixed names engines scale on
        assert value(text, "ferry_stall_fraction") == value(text, "ferry_consumer_stall_fraction")
        assert "ferry_consumer_stall_fraction" in text and 'ferry_consumer_producer_batches_total{producer="' in text
        produced = wait_for(lambda: (lambda t: t if value(t, "ferry_producer_batches_sent_total") >= 10 else None)(
            scrape(producer_port)), 10, "the producer's figures")
        assert value(produced, "ferry_producer_consumers") == 1
        # the types come from the declarations: counters only grow, gauges go both ways
        for name, kind in [("batches", "counter"), ("producers_seen", "counter"), ("shared_batches", "counter"),
                           ("producers", "gauge"), ("buffered", "gauge"), ("stall_fraction", "gauge")]:
            assert metric_type(text, f"ferry_consumer_{name}") == kind, name
        assert value(text, "ferry_consumer_producers_seen_total") == 1
        assert metric_type(produced, "ferry_producer_batches_sent") == "counter"
        assert metric_type(produced, "ferry_producer_consumers") == "gauge"
    check.assert_clean()  # the metrics thread and its socket are gone too


def test_under_torchrun_each_rank_serves_its_metrics_on_its_own_port(tmp_path, monkeypatch):
    """metrics_port is shifted by LOCAL_RANK, as the endpoint is: a DDP trial's rank 1 died with 'Address already in
    use' where rank 0 served."""
    port = free_port()
    monkeypatch.setenv("LOCAL_RANK", "1")
    with RemoteLoader(endpoint=f"ipc://{tmp_path}/consumer.sock", batch_size=2, dataset_len=4,
                      metrics_port=port - 1):
        assert value(scrape(port), "ferry_consumer_producers") == 0


def test_stats_fields_are_declared_once_with_their_type(endpoint):
    from ferry.common.metrics import COUNTER, GAUGE
    from ferry.consumer.figures.counters import STATS

    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=4) as loader:
        stats = loader.stats()
    assert list(stats) == [f.name for f in STATS]  # every field declared, none twice, none undeclared
    kinds = {f.name: f.kind for f in STATS}
    assert {n for n, k in kinds.items() if k == COUNTER} >= {"batches", "bytes", "received", "shared_batches",
                                                          "producers_seen", "reissued", "skipped_samples"}
    assert {n for n, k in kinds.items() if k == GAUGE} >= {"producers", "buffered", "in_flight", "stall_fraction",
                                                        "epoch_stall_fraction", "epoch"}
    assert kinds["per_producer"] is None and kinds["shared_memory"] is None  # structured: exported apart


def test_the_export_uses_the_declared_types():
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from ferry.common.metrics import COUNTER, GAUGE, Figure, _Collector

    declared = [Figure("grows", COUNTER, "a counter"), Figure("moves", GAUGE, "a gauge"), Figure("tree", None, "")]
    collector = _Collector(lambda: {"grows": 3, "moves": 1.5, "tree": {"a": 1}, "other": 2, "flag": True},
                           "x", declared)
    families = {f.name: f for f in collector.collect()}
    assert isinstance(families["x_grows"], CounterMetricFamily) and families["x_grows"].documentation == "a counter"
    assert isinstance(families["x_moves"], GaugeMetricFamily)
    assert isinstance(families["x_other"], GaugeMetricFamily)  # undeclared numbers are gauges
    assert "x_tree" not in families and "x_flag" not in families


def test_the_progress_line_shows_a_slow_rate_instead_of_rounding_it_to_zero():
    from ferry.consumer.figures.observer import rate_text

    assert [rate_text(x) for x in (0.0, 0.004, 0.1, 0.126, 2.5, 9.94, 12.4, 1234.5)] == [
        "0", "0.004", "0.1", "0.13", "2.5", "9.9", "12", "1234"]
