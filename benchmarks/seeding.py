"""python -m benchmarks.seeding [--samples N] [--rounds R]: what per-sample seeding costs (docs/performance.md).

Two measurements, each side by side with seeding off:

* the seeding itself: ``seed_generators`` (Python's ``random``, numpy's global generator, torch's CPU generator)
  per sample, against the bare loop, in this process;
* end to end: a dataset class of one's own loaded one sample at a time (the case where seeding is on by default),
  ``benchmarks.datasets:UserTorchTransform`` (np.load, normalize and a random flip in torch) on small tiles, with 2
  local producers, ``seed_per_sample=True`` against ``False``, alternating epochs (epoch 0 of a fresh loader each
  time), samples/s and their ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from ferry import RemoteLoader
from ferry.common.sampleinfo import kept_generators, sample_seed, seed_generators

from .datasets import UserTorchTransform
from .scenarios import epoch_rate, make_npy


def seeding_cost_us(n: int = 20000) -> tuple[float, float]:
    """Microseconds per sample of ``seed_generators`` and of the bare loop around it."""
    import numpy  # noqa: F401  (seeded where loaded, as in a producer)
    import torch  # noqa: F401

    seeds = [sample_seed(0, 0, i) for i in range(n)]
    with kept_generators():
        start = time.perf_counter()
        for seed in seeds:
            seed_generators(seed)
        seeded = time.perf_counter() - start
    start = time.perf_counter()
    for seed in seeds:
        pass
    bare = time.perf_counter() - start
    return seeded / n * 1e6, bare / n * 1e6


def epoch0_rate(dataset: UserTorchTransform, seed_per_sample: bool) -> float:
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=32, shuffle=True, log_every=None,
                      seed_per_sample=seed_per_sample) as loader:
        return epoch_rate(loader, 32, epochs=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seeding", description=__doc__)
    parser.add_argument("--samples", type=int, default=512, help="tiles in the dataset (default 512)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args(argv)
    cost, bare = seeding_cost_us()
    print(f"seed_generators: {cost:.1f} us per sample (bare loop {bare:.2f} us)")
    root = tempfile.mkdtemp(prefix="ferry-bench-seeding-")
    try:
        make_npy(root, args.samples, (13, 64, 64), "float32")
        dataset = UserTorchTransform(root)
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                rates[on].append(epoch0_rate(dataset, on))
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"epoch 0, 2 local producers, {args.samples} samples of 13x64x64 float32 through a torch transform, "
              f"one sample at a time: seeded {on:.0f} samples/s ({min(rates[True]):.0f}..{max(rates[True]):.0f}), "
              f"not seeded {off:.0f} ({min(rates[False]):.0f}..{max(rates[False]):.0f}); ratio {on / off:.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
