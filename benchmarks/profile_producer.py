"""Where a producer's time goes on the general path: one Batcher (no sockets) assembling batches of a
user-written Dataset, under cProfile, with the process's page faults.

python -m benchmarks.profile_producer [--samples 128] [--batches 16] [--dtype float32] [--profile]
Run it under ``/usr/bin/time -v`` for the whole process's faults as well.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import queue
import resource
import shutil
import tempfile
import threading
import time

import numpy as np

from ferry.common.datasets import NpyFolderDataset
from ferry.common.waker import Waker
from ferry.producer import keep_freed_memory
from ferry.producer.loading import batcher as batcher_module
from ferry.producer.loading.batcher import Batcher, Job

from .datasets import UserNpyFolder
from .scenarios import make_npy


def run(dataset, batches: int, batch_size: int, threads: int) -> tuple[float, int]:
    done: queue.SimpleQueue = queue.SimpleQueue()
    waker = Waker()
    batcher = Batcher(dataset, threads=threads, batch_workers=1, done=done, waker=waker)
    try:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        for seq in range(batches):
            indices = rng.choice(len(dataset), batch_size, replace=False).tolist()
            batcher.submit(Job(0, 1, seq, 0, seq, indices, "raise"))
            outcome = done.get(timeout=120)
            assert not outcome.failed, outcome.frames[0]
            if outcome.buffer is not None:
                batcher.pool.release(outcome.buffer)  # as the service does once ZeroMQ sent it
            del outcome
        took = time.perf_counter() - start
        return took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    finally:
        batcher.close()
        waker.close()


class ThreadProfiles:
    """cProfile sees one thread; this gives each pool thread its own profiler around the batcher's thread
    bodies (the batch worker and the sample loaders), merged at the end."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.profiles: list[cProfile.Profile] = []
        self.lock = threading.Lock()
        self.active = False

    def wrap(self, fn):
        def profiled(*args, **kwargs):
            if not self.active or getattr(self.local, "inside", False):
                return fn(*args, **kwargs)
            profile = getattr(self.local, "profile", None)
            if profile is None:
                profile = self.local.profile = cProfile.Profile()
                with self.lock:
                    self.profiles.append(profile)
            self.local.inside = True
            profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                profile.disable()
                self.local.inside = False
        return profiled

    def install(self) -> None:
        for name in dir(batcher_module):
            if name.startswith("_load"):
                setattr(batcher_module, name, self.wrap(getattr(batcher_module, name)))
        Batcher._run = self.wrap(Batcher._run)

    def print(self, top: int) -> None:
        stats = pstats.Stats(self.profiles[0])
        for profile in self.profiles[1:]:
            stats.add(profile)
        stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shape", default="13,299,299")
    parser.add_argument("--no-mallopt", action="store_true", help="leave glibc's trimming as it is")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--fast-path", action="store_true", help="Ferry's built-in npy-folder reader instead")
    args = parser.parse_args()
    if not args.no_mallopt:
        keep_freed_memory()
    shape = tuple(int(x) for x in args.shape.split(","))
    root = tempfile.mkdtemp(prefix="ferry-profile-")
    try:
        make_npy(root, args.samples, shape, args.dtype)
        dataset = NpyFolderDataset(root) if args.fast_path else UserNpyFolder(root)
        profiles = ThreadProfiles()
        if args.profile:
            profiles.install()
        run(dataset, 2, args.batch_size, args.threads)  # the first batch learns the layout
        profiles.active = args.profile
        took, faults = run(dataset, args.batches, args.batch_size, args.threads)
        profiles.active = False
        per = took / args.batches
        print(f"{args.dtype} {shape} batch {args.batch_size}: {per * 1e3:.1f} ms/batch, "
              f"{args.batch_size / per:.0f} samples/s, {faults / args.batches:.0f} minor faults/batch")
        if args.profile:
            profiles.print(12)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
