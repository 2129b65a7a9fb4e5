"""A producer's window: tasks taken ahead of its slots (``--ahead``) against its slots only (``--ahead 0``).

python -m benchmarks.window [--rounds 3] [--delay 0.002] [--mib 0.25,1]

Two measurements, each alternating ``FERRY_AHEAD=0`` and the default (as many as ``--slots``) in the same code,
every peer in its own process (producers by hand, ``python -m ferry.producer``, read ``FERRY_AHEAD``):

* latency-bound producers: 2 over tcp 127.0.0.1, default threads and slots, batches of one sample that waits
  ``delay`` seconds (storage latency, no CPU): samples/s after 50 batches;
* ingest (scenario 4's peers, :mod:`benchmarks.ingest_peers`): one producer ``--slots 4`` sending ready-made
  batches of each ``--mib`` size to a RemoteLoader, GB/s, with raw pyzmq in the same rotation.

Prints each run and the medians. The figures behind docs/performance.md's "Tasks ahead of the slots".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager
from typing import Iterator

from ferry import RemoteLoader
from ferry.common.constants import DEFAULT_SLOTS, DEFAULT_THREADS

from .scenarios import Producers, free_endpoint, ingest_once, wait_producers

CONFIGS = {"ahead 0": "0", "default": None}  # the FERRY_AHEAD each producer starts with


@contextmanager
def producers_ahead(value: str | None) -> Iterator[None]:
    """Producers started inside take ``FERRY_AHEAD=value`` (None: unset, the default)."""
    before = os.environ.pop("FERRY_AHEAD", None)
    if value is not None:
        os.environ["FERRY_AHEAD"] = value
    try:
        yield
    finally:
        os.environ.pop("FERRY_AHEAD", None)
        if before is not None:
            os.environ["FERRY_AHEAD"] = before


def latency_bound(delay: float, samples: int = 1500) -> float:
    """Samples/s from 2 producers by hand whose one-sample batches each wait ``delay`` s."""
    args = {"length": 1_000_000, "shape": [13, 8, 8], "delay": delay}
    endpoint = free_endpoint()
    producers = Producers(endpoint)
    try:
        producers.add(2, "synthetic", args, threads=DEFAULT_THREADS, slots=DEFAULT_SLOTS)
        with RemoteLoader(endpoint=endpoint, batch_size=1, heartbeat=0.2, no_producer_timeout=120) as loader:
            wait_producers(loader, 2)
            it = iter(loader)
            for _ in range(50):
                next(it)
            start = time.perf_counter()
            for _ in range(samples):
                next(it)
            return samples / (time.perf_counter() - start)
    finally:
        producers.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.002)
    parser.add_argument("--mib", default="0.25,1")
    args = parser.parse_args()
    runs: dict[tuple[str, str], list[float]] = {}

    def record(case: str, system: str, value: float) -> None:
        runs.setdefault((case, system), []).append(value)
        print(f"{case}: {system} {value:.4g}", flush=True)

    for _ in range(args.rounds):
        for name, value in CONFIGS.items():
            with producers_ahead(value):
                record(f"latency-bound, {args.delay * 1e3:g} ms a batch, samples/s", name, latency_bound(args.delay))
    for mib in (float(m) for m in args.mib.split(",")):
        count = max(200, int(768 / mib))
        case = f"ingest {mib:g} MiB over tcp, GB/s"
        for _ in range(args.rounds):
            record(case, "raw pyzmq", ingest_once("pyzmq", mib, count, "tcp", None))
            for name, value in CONFIGS.items():
                with producers_ahead(value):
                    record(case, name, ingest_once("ferry", mib, count, "tcp", None))
    print()
    for (case, system), values in runs.items():
        print(f"{case}: {system} {statistics.median(values):.4g} ({min(values):.4g}..{max(values):.4g})")


if __name__ == "__main__":
    main()
