"""python -m benchmarks [--quick | --tiny] [--only 1,2,...] [--out DIR]"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from ferry import keep_freed_memory

from .harness import Report
from .scenarios import SIZES, first_batch, ingest, scale_out, seed_workload, slow_storage, stall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a short run (about 3 minutes on 2 cores)")
    mode.add_argument("--tiny", action="store_true", help="tiny sizes, for the test suite (seconds)")
    parser.add_argument("--only", default="1,2,3,4,5,6", help="comma-separated scenario numbers (default 1-6; 7: "
                        "compression, needs root and tc; 8: Ray Data as a peer, needs ferry[ray])")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"),
                        help="folder for the JSON results (default benchmarks/results)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    # the loaders here receive over sockets: keep freed frames for reuse, as docs/tuning.md#frame-size advises a
    # trainer (a loader no longer does it by itself; the figures in docs/performance.md were taken with it)
    keep_freed_memory()
    name = "tiny" if args.tiny else "quick" if args.quick else "full"
    sizes = SIZES[name]
    only = {int(x) for x in args.only.split(",") if x}
    report = Report(mode=name)
    report.notes.append("warm page cache (datasets are written just before they are read)")
    started = time.monotonic()
    print(f"ferry benchmarks ({name}): scenarios {sorted(only)} at commit {report.machine['commit']}", flush=True)
    transport = None

    def timed(number: int, run) -> None:
        nonlocal transport
        if number not in only:
            return
        began = time.monotonic()
        result = run()
        if number == 4:
            transport = result
        report.notes.append(f"scenario {number} took {time.monotonic() - began:.0f} s")

    timed(4, lambda: ingest(report, sizes))
    timed(1, lambda: seed_workload(report, sizes, transport))
    timed(2, lambda: slow_storage(report, sizes))
    timed(3, lambda: scale_out(report, sizes))
    timed(5, lambda: stall(report, sizes))
    timed(6, lambda: first_batch(report, sizes))
    timed(7, lambda: __import__("benchmarks.compression", fromlist=["*"]).compression_scenario(report, sizes))
    timed(8, lambda: __import__("benchmarks.ray_data", fromlist=["*"]).ray_data_scenario(report, sizes))
    path = report.save(args.out)
    print(f"\n{report.markdown()}\n")
    for note in report.notes:
        print(f"- {note}")
    print(f"\nresults: {path} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
