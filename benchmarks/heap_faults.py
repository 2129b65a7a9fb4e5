"""python -m benchmarks.heap_faults [--runs N] [--mb MB] [--mib 1,4]: what ``ferry.keep_freed_memory()``
saves a trainer.

For batches of 1 and 4 MiB (by default) over tcp 127.0.0.1, the ingest scenario's two processes (a ``python -m
ferry.producer`` serving ``benchmarks.datasets:Blank``, and ``benchmarks.ingest_peers ferry-consume``, a
RemoteLoader that calls ``keep_freed_memory()``), once as they are and once with
``FERRY_KEEP_FREED_MEMORY=0`` in the receiver's environment, which turns the call off (glibc's defaults).
Alternating, N runs each. Prints the receiver's minor page faults per GB received and its GB/s.
"""

from __future__ import annotations

import argparse
import os
import sys

from .scenarios import env, ferry_sender, free_endpoint, receive_pair


def receive(mib: float, count: int, keep: bool) -> dict:
    """One receiver and its producer; the receiver's JSON line (benchmarks/ingest_peers.py)."""
    endpoint = free_endpoint()
    receiver_env = env()
    receiver_env["FERRY_KEEP_FREED_MEMORY"] = "1" if keep else "0"
    return receive_pair([sys.executable, "-m", "benchmarks.ingest_peers", "ferry-consume", endpoint, str(mib),
                         str(count)], ferry_sender(endpoint, mib), receiver_env, f"receiver ({mib} MiB, keep={keep})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heap_faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each case, alternating (default 2)")
    parser.add_argument("--mb", type=float, default=1000, help="megabytes received per run (default 1000)")
    parser.add_argument("--mib", default="1,4", help="comma-separated batch sizes in MiB (default 1,4)")
    args = parser.parse_args(argv)
    print("| batch | keep_freed_memory() | minor faults per GB | GB/s |\n|---|---|---|---|")
    for mib in (float(m) for m in args.mib.split(",") if m):
        count = max(8, int(args.mb * 1e6 / (mib * (1 << 20))))
        figures: dict[bool, list[dict]] = {True: [], False: []}
        for _ in range(args.runs):
            for keep in (False, True):
                figures[keep].append(receive(mib, count, keep))
        for keep in (False, True):
            faults = sorted(f["minflt_per_gb"] for f in figures[keep])
            rates = sorted(f["gbps"] for f in figures[keep])
            print(f"| {mib:g} MiB | {'called' if keep else 'not called'} | {faults[0]:,.0f}-{faults[-1]:,.0f} | "
                  f"{rates[0]:.2f}-{rates[-1]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
