"""The optional Prometheus endpoints of the consumer and the producer, scraped for real."""

import urllib.request

import pytest

from ferry import RemoteLoader

from .helpers import LeakCheck, free_port, wait_for

pytest.importorskip("prometheus_client", reason="the metrics extra (prometheus-client) is not installed")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the scrape")


def test_consumer_and_producer_metrics_are_scraped(endpoint, spawn):
    producer_port, consumer_port = free_port(), free_port()
    spawn(endpoint, "synthetic", {"length": 40, "shape": [4]}, extra=["--metrics-port", str(producer_port)])
    check = LeakCheck()
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, metrics_port=consumer_port) as loader:
        assert len(list(loader)) == 10
        text = scrape(consumer_port)
        assert value(text, "ferry_consumer_batches_total") == 10
        assert value(text, "ferry_consumer_producers") == 1
        assert "ferry_consumer_stall_fraction" in text and 'ferry_consumer_producer_batches_total{producer="' in text
        produced = wait_for(lambda: (lambda t: t if value(t, "ferry_producer_batches_sent_total") >= 10 else None)(
            scrape(producer_port)), 10, "the producer's figures")
        assert value(produced, "ferry_producer_consumers") == 1
    check.assert_clean()  # the metrics thread and its socket are gone too
