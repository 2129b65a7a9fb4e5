"""An optional Prometheus endpoint (``pip install 'ferry[metrics]'``), for the consumer and the producer.

The server thread reads the owner's figures at each scrape; nothing is recorded in between. ``close()``
shuts the HTTP server down and joins its thread. An owner may add plain-text paths that answer yes (200) or no
(503), such as the producer's ``/livez`` and ``/readyz`` for an engine's HTTP probes (producer/status.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ferry.common.errors import ConfigError

__all__ = ["MetricsServer", "Figure", "COUNTER", "GAUGE", "PRODUCER_FIGURES", "JOB_FIGURES"]

#: A figure that only grows over its owner's life: exported as a Prometheus counter (``<name>_total``).
COUNTER = "counter"
#: A figure that goes up and down: exported as a gauge.
GAUGE = "gauge"


@dataclass(frozen=True)
class Figure:
    """One field of an owner's figures. ``kind`` is COUNTER, GAUGE, or None for a structured field that the
    export skips or handles on its own (``per_producer``). ``also``: a second name it is exported under, without
    the owner's prefix (the names engines scale on: ``ferry_producers_needed``)."""

    name: str
    kind: str | None
    help: str
    also: str = ""


#: The producer's figures (``Producer.figures()`` in producer/io/service.py).
PRODUCER_FIGURES: tuple[Figure, ...] = (
    Figure("batches_sent", COUNTER, "batches sent to consumers"),
    Figure("bytes_sent", COUNTER, "bytes of the batches sent"),
    Figure("shared_batches", COUNTER, "batches written into a consumer's shared memory"),
    Figure("invalid_messages", COUNTER, "malformed messages from consumers (dropped)"),
    Figure("stale_messages", COUNTER, "messages of an old session (dropped)"),
    Figure("pending", GAUGE, "tasks held: batches being loaded, waiting to be sent, or queued ahead of a free slot"),
    Figure("consumers", GAUGE, "consumers being served now"),
    Figure("links", GAUGE, "consumer connections: one per endpoint, and per address an endpoint's name resolves to"),
    Figure("pool_demand", GAUGE, "producers the jobs this producer serves need in all: the sum of their loops' "
           "demand gauges (ferry_producers_needed), as their PINGs report them", also="ferry_pool_demand"),
    Figure("per_job", None, "figures per job (consumer endpoint -> dict; producer/core/sharing.py)"),
)

#: The per-job figures of a pool producer (``per_job``), exported with the labels ``job`` (the consumer's endpoint)
#: and ``dataset``: name -> (kind, help).
JOB_FIGURES: dict[str, tuple[str, str]] = {
    "weight": (GAUGE, "the job's weight (RemoteLoader(weight=))"),
    "queued": (GAUGE, "the job's tasks waiting for a worker here"),
    "running": (GAUGE, "the job's tasks being loaded here"),
    "served_s": (COUNTER, "producer seconds the job's tasks took here: its share is its rate over all jobs'"),
    "waited_s": (COUNTER, "seconds the job's tasks waited here for a worker"),
    "tasks": (COUNTER, "the job's tasks finished here"),
    "needed": (GAUGE, "producers the job's loop needs (its demand gauge, from its PINGs)"),
    "stall": (GAUGE, "the fraction of time the job's loop waited for data (from its PINGs)"),
}


class MetricsServer:
    """Serves ``figures()`` on ``addr:port``, typed by ``declared`` (an undeclared number is a gauge), on a thread
    of its own (``ferry-metrics``).

    ``answers``: more paths, each answered by a function giving yes or no and one line of text (200 or 503, plain
    text), e.g. ``{"/livez": ...}``; every other path serves the metrics.
    """

    def __init__(self, port: int, figures: Callable[[], dict[str, Any]], prefix: str, addr: str = "0.0.0.0",
                 declared: Iterable[Figure] = PRODUCER_FIGURES,
                 answers: Mapping[str, Callable[[], tuple[bool, str]]] | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
            from prometheus_client.exposition import ThreadingWSGIServer
        except ImportError:
            raise ConfigError("a metrics port needs prometheus-client: pip install 'ferry[metrics]'") from None
        from wsgiref.simple_server import make_server

        registry = CollectorRegistry()
        registry.register(_Collector(figures, prefix, declared))
        app = _with_answers(make_wsgi_app(registry), dict(answers or {}))
        try:
            self._httpd = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_quiet_handler())
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from None
        self._closed_here = False  # close() was called on the serving thread itself (by the gc)
        self._thread = threading.Thread(target=self._serve, name="ferry-metrics", daemon=True)
        self._thread.start()
        self.port = self._httpd.server_port

    def _serve(self) -> None:
        try:
            self._httpd.serve_forever()
        finally:
            if self._closed_here:  # nobody joins this thread to close the socket
                self._httpd.server_close()

    def close(self) -> None:
        if self._thread is threading.current_thread():  # the gc ran its owner's shutdown on the serving loop:
            # shutdown() would wait for this very loop; the flag it sets ends the loop at its next turn
            self._closed_here = True
            self._httpd._BaseServer__shutdown_request = True  # noqa: SLF001 - socketserver's own stop flag
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def _with_answers(metrics: Callable, answers: dict[str, Callable[[], tuple[bool, str]]]) -> Callable:
    """A WSGI app: the paths in ``answers`` answered yes (200) or no (503) in one line, the rest by ``metrics``."""

    def app(environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        answer = answers.get(environ.get("PATH_INFO", ""))
        if answer is None:
            return metrics(environ, start_response)
        ok, text = answer()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode() + b"\n"]

    return app


def _quiet_handler() -> type:
    """A request handler that logs nothing (a scrape every few seconds is no event)."""
    from wsgiref.simple_server import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Quiet


class _Collector:
    def __init__(self, figures: Callable[[], dict[str, Any]], prefix: str, declared: Iterable[Figure]) -> None:
        self._figures, self._prefix = figures, prefix
        self._declared = {f.name: f for f in declared}

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        figures = self._figures()
        for name, value in figures.items():
            declared = self._declared.get(name, Figure(name, GAUGE, f"ferry {name}"))
            if declared.kind is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            family = CounterMetricFamily if declared.kind == COUNTER else GaugeMetricFamily
            yield family(f"{self._prefix}_{name}", declared.help, value=value)
            if declared.also:
                yield family(declared.also, declared.help, value=value)
        per_job = figures.get("per_job")
        if isinstance(per_job, dict):
            for field, (kind, help_text) in JOB_FIGURES.items():
                family = (CounterMetricFamily if kind == COUNTER else GaugeMetricFamily)(
                    f"{self._prefix}_job_{field}", help_text, labels=["job", "dataset"])
                for job, values in per_job.items():
                    family.add_metric([job, str(values.get("dataset", ""))], values.get(field, 0))
                yield family
        per_producer = figures.get("per_producer")
        if isinstance(per_producer, dict):
            batches = CounterMetricFamily(f"{self._prefix}_producer_batches", "batches per producer",
                                          labels=["producer"])
            for producer, p in per_producer.items():
                batches.add_metric([producer], p["batches"])
            yield batches
