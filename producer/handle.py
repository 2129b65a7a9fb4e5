"""A handle on one :func:`ferry.producer.serve` call, for the threads (or an engine's calls) around it.

``serve(config, dataset, stop=handle)`` runs until ``handle.set()``: the same stop as SIGTERM's (the main loop
leaves its poll, says BYE to every consumer, which re-issue what it held without charging an attempt, drains for
at most ``drain_timeout`` seconds and returns 0). It is event-like, as :class:`threading.Event`: ``set`` and
``is_set`` (no ``wait``: nothing here may take a lock). A handle set before ``serve`` built its producer stops it
as soon as it is built. SIGTERM and SIGINT set the same handle where ``serve`` runs on the main thread, so there is
one way to stop a producer.

``figures()`` reads the running producer's figures (what its metrics endpoint exports: batches sent, the jobs
it serves and the demand each consumer reports in its PINGs, ``pool_demand``), or None while it is not running.

It takes no lock: ``set`` may run in a signal handler, between two bytecodes of a thread that would hold such a
lock (producer/io/service.py, ``Producer.stop``). ``set`` stores the flag before it reads the producer, ``_attach``
stores the producer before it reads the flag; whichever runs second sees the other, so a stop is never lost
(both stopping it is harmless: ``Producer.stop`` is idempotent).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServeHandle"]


class ServeHandle:
    """Stop a :func:`~ferry.producer.serve` call from another thread, a signal handler or an actor's method; read
    its figures. One handle serves one call at a time."""

    def __init__(self) -> None:
        self._set = False  # the flag a signal handler writes: no lock taken on the way
        self._producer: Any = None

    def set(self) -> None:
        """Ask the producer to stop (BYE, drain, ``serve`` returns 0). Safe from any thread and from a signal
        handler; idempotent."""
        self._set = True
        producer = self._producer
        if producer is not None:
            producer.stop()

    def is_set(self) -> bool:
        return self._set

    def figures(self) -> dict[str, Any] | None:
        """The running producer's figures (``Producer.figures``), or None before it runs and after it returned."""
        producer = self._producer
        return producer.figures() if producer is not None else None

    # --- serve's side ---------------------------------------------------------------------------------
    def _attach(self, producer: Any) -> None:
        self._producer = producer
        if self._set:
            producer.stop()

    def _detach(self) -> None:
        self._producer = None
