"""An optional Prometheus endpoint (``pip install 'ferry[metrics]'``), for the consumer and the producer.

The server thread reads the owner's figures at each scrape; nothing is recorded in between. ``close()``
shuts the HTTP server down and joins its thread.
"""

from __future__ import annotations

from typing import Any, Callable

from ferry.common.errors import ConfigError

__all__ = ["MetricsServer"]

#: Figures that only grow; exported as Prometheus counters (``<name>_total``).
COUNTERS = {"batches", "bytes", "received", "received_bytes", "reissued", "duplicates", "stale",
            "invalid_messages", "skipped_samples", "wait_s", "active_s", "batches_sent", "bytes_sent",
            "stale_messages"}


class MetricsServer:
    def __init__(self, port: int, figures: Callable[[], dict[str, Any]], prefix: str, addr: str = "0.0.0.0") -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigError("a metrics port needs prometheus-client: pip install 'ferry[metrics]'") from None
        registry = CollectorRegistry()
        registry.register(_Collector(figures, prefix))
        try:
            self._httpd, self._thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from None
        self.port = self._httpd.server_port

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _Collector:
    def __init__(self, figures: Callable[[], dict[str, Any]], prefix: str) -> None:
        self._figures, self._prefix = figures, prefix

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        figures = self._figures()
        for name, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric = f"{self._prefix}_{name}"
            if name in COUNTERS:
                yield CounterMetricFamily(metric, f"ferry {name}", value=value)
            else:
                yield GaugeMetricFamily(metric, f"ferry {name}", value=value)
        per_producer = figures.get("per_producer")
        if isinstance(per_producer, dict):
            batches = CounterMetricFamily(f"{self._prefix}_producer_batches", "batches per producer",
                                          labels=["producer"])
            for producer, p in per_producer.items():
                batches.add_metric([producer], p["batches"])
            yield batches
