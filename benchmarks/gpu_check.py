"""GPU check: Ferry's staging path against raw pinned copies, on a CUDA machine (about a minute; at most 3).

    python -m benchmarks.gpu_check            # needs CUDA: measures, checks, prints a table
    python -m benchmarks.gpu_check --cpu      # the CPU fallback: the same code paths, tiny sizes, no targets

Per batch size it measures the host-to-device rate of the same bytes through:

* raw: ``copy_(non_blocking=True)`` from one buffer pinned by torch: what the hardware gives (the reference);
* slab: Ferry's ``CudaStager`` on batches in shared-memory slots, as local producers write them. The used
  part of each slot is registered with ``cudaHostRegister`` once, and copies start from the slot itself.
  Target: >= 0.90 of raw;
* socket, chunked: a leaf that arrived in several frames, assembled into a registered receive-pool buffer
  and copied from there (the one CPU copy is the assembly, which splitting needs anyway);
* socket, one frame: a frame libzmq owns, copied into a reused pinned buffer first (one CPU copy).

and the step time of a compute-bound loop fed by Ferry (local producers, device="cuda") against the same loop
on batches already on the device (target <= 1.05x).

Checks (exit status 1 if one fails, with the table printed first): every batch reaches the device equal to
its source, byte for byte, while its source is rewritten for the next batch as soon as Ferry lets it (a slot,
or a pool buffer, handed back before its copy completed would show as a wrong batch); slab batches are
copied from the slot with no pinned copy; CUDA accepted every registration; close releases them all.

With ``--cpu`` the stager runs with the CPU as its "device", a side stream whose events are complete at once,
and a registry that only keeps the books (nothing is page-locked): the bookkeeping and checks run, the
rates mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

from ferry import RemoteLoader, keep_freed_memory
from ferry.common import shm
from ferry.common.codec import decode_tree, encode_tree
from ferry.common.constants import MIN_FRAME_BYTES
from ferry.consumer.core import Delivery
from ferry.consumer.staging.pinning import HostRegistry
from ferry.consumer.staging.cuda import CudaStager

SLOTS = 4  # slab slots in the check: reuse starts at the fifth batch
CHECKED = 3 * SLOTS  # batches whose every byte is compared on the device


class _BooksOnly:
    """``--cpu``: a CUDA runtime that accepts every registration and locks nothing."""

    cudaError = int

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        return 0

    def cudaGetErrorString(self, code: int) -> str:
        return "none"


class _Done:
    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _CpuStream:
    def scope(self) -> Any:
        return contextlib.nullcontext()

    def record(self) -> _Done:
        return _Done()


def make_stager(device: torch.device, cuda: bool, slab: shm.Slab | None) -> CudaStager:
    if cuda:
        return CudaStager(device, slab=slab)
    return CudaStager(device, slab=slab, registry=HostRegistry(_BooksOnly(), clear_error=lambda: None),
                      stream=_CpuStream(), pin=lambda t: t)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def raw_h2d_gbps(nbytes: int, reps: int, device: torch.device, cuda: bool) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8)
    src = src.pin_memory() if cuda else src
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    sync(device)
    return nbytes * reps / (time.perf_counter() - start) / 1e9


class SlabFeed:
    """Batches in slab slots, as local producers write them: a batch goes into whichever slot is free."""

    name = "slab"

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.slab = shm.Slab(SLOTS, nbytes)
        self.events: deque[Any] = deque()

    def batch(self, stager: CudaStager, seq: int, value: int | None) -> Delivery:
        slot = self.slab.take()
        while slot is None:  # every slot is under a copy or was not handed back: wait for the oldest copy
            if not self.events:
                raise RuntimeError("no slab slot came back after every copy completed")
            self.events.popleft().synchronize()
            stager.reclaim()
            slot = self.slab.take()
        leaf = self.slab.region(slot)[: self.nbytes]
        if value is not None:
            leaf.fill(value)  # the producer writes the batch
        return Delivery(run=0, seq=seq, tree=[leaf])

    def staged(self, delivery: Delivery) -> None:
        self.events.append(delivery.event)

    def close(self) -> None:
        self.slab.close()


class SocketFeed:
    """Batches decoded from received frames (the codec's own decoding), from a few distinct sources."""

    def __init__(self, nbytes: int, chunked: bool) -> None:
        self.name = "socket, chunked" if chunked else "socket, one frame"
        chunk = min(MIN_FRAME_BYTES, max(nbytes // 4, 1)) if chunked else None
        self.sources = [np.full(nbytes, value, np.uint8) for value in range(1, 5)]
        self.trees = [decode_tree(*encode_tree([source], chunk_bytes=chunk)) for source in self.sources]

    def value_of(self, seq: int) -> int:
        return seq % len(self.sources) + 1

    def batch(self, stager: CudaStager, seq: int, value: int | None) -> Delivery:
        return Delivery(run=0, seq=seq, tree=list(self.trees[seq % len(self.trees)]))

    def staged(self, delivery: Delivery) -> None:
        pass

    def close(self) -> None:
        pass


def measure(make_feed: Callable[[], Any], nbytes: int, reps: int, device: torch.device,
            cuda: bool) -> tuple[str, float, list[str], dict[str, int]]:
    """(name, median GB/s of 3 timed passes, failed checks, the stager's counts)."""
    feed = make_feed()
    stager = make_stager(device, cuda, getattr(feed, "slab", None))
    failures: list[str] = []
    try:
        for seq in range(SLOTS):  # warm-up: every slot written and registered once, pools filled
            delivery = feed.batch(stager, seq, 1)
            stager.stage(delivery)
            feed.staged(delivery)
        sync(device)
        rates = []
        for _ in range(3):
            start = time.perf_counter()
            for seq in range(reps):
                delivery = feed.batch(stager, seq, None)
                stager.stage(delivery)
                feed.staged(delivery)
            delivery.event.synchronize()
            rates.append(nbytes * reps / (time.perf_counter() - start) / 1e9)
        kept: list[tuple[int, torch.Tensor]] = []
        for seq in range(CHECKED):  # each batch's source rewritten as soon as it is handed out again
            value = seq % 250 + 2 if isinstance(feed, SlabFeed) else feed.value_of(seq)
            delivery = feed.batch(stager, seq, value)
            stager.stage(delivery)
            feed.staged(delivery)
            kept.append((value, delivery.tree[0]))
        sync(device)
        for seq, (value, tensor) in enumerate(kept):
            if tensor.numel() != nbytes or not bool(torch.all(tensor == value)):
                failures.append(f"{feed.name} {nbytes >> 20} MiB: batch {seq} differs from its source on the device")
        counts = {"direct": stager.direct, "through_pool": stager.through_pool, "calls": stager.registry.calls,
                  "failed": stager.registry.failures}
        if isinstance(feed, SlabFeed) and stager.through_pool:
            failures.append(f"slab {nbytes >> 20} MiB: {stager.through_pool} leaves copied into a pinned buffer "
                            f"first instead of from their slot")
        if stager.registry.failures:
            failures.append(f"{feed.name} {nbytes >> 20} MiB: CUDA refused {stager.registry.failures} registrations")
    finally:
        registry = stager.registry
        stager.close()
        feed.close()
    if registry.ranges():
        failures.append(f"{feed.name} {nbytes >> 20} MiB: registrations left after close: {registry!r}")
    return feed.name, statistics.median(rates), failures, counts


def step_times(device: torch.device | None, size: int, steps: int, batch_shape: tuple[int, ...]) -> tuple[float, float]:
    """Mean step time: fed by Ferry, and on data already on the device."""
    dev = device or torch.device("cpu")
    dtype = torch.bfloat16 if device is not None else torch.float32
    weight = torch.randn(size, size, device=dev, dtype=dtype)

    def step(x: torch.Tensor) -> None:
        h = x.to(dtype).reshape(-1)[: size * 8].reshape(8, size) if x.numel() >= size * 8 else \
            torch.ones(8, size, device=dev, dtype=dtype)
        for _ in range(8):
            h = torch.tanh(h @ weight)
        if device is not None:
            torch.cuda.current_stream(device).synchronize()

    length = steps + 8  # an epoch covers the warm-up and the timed steps
    with RemoteLoader(dataset="synthetic", dataset_args={"length": length, "shape": list(batch_shape),
                                                         "dtype": "uint8"},
                      local_producers=2, batch_size=1, device=device, no_producer_timeout=120) as loader:
        batches = list(loader)  # warm-up epoch: producers, pools, allocator, registrations
        on_device = [b[0].to(dev) for b in batches]
        for x in on_device[:4]:
            step(x)
        start = time.perf_counter()
        for x in on_device[:steps]:
            step(x)
        resident = (time.perf_counter() - start) / steps
        it = iter(loader)
        for _ in range(4):  # steady state: the pipeline has filled
            step(next(it)[0])
        start = time.perf_counter()
        for _ in range(steps):
            step(next(it)[0])
        fed = (time.perf_counter() - start) / steps
    return fed, resident


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the CPU fallback (tiny sizes, no targets)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # as docs/tuning.md#frame-size advises a trainer that receives over a socket
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        print("gpu_check: CUDA is not available; run with --cpu for the CPU fallback", file=sys.stderr)
        return 2
    if not shm.available():
        print("gpu_check: needs memfd_create and /proc for the slab", file=sys.stderr)
        return 2
    device = torch.device("cuda") if cuda else torch.device("cpu")
    sizes = [16 << 20, 64 << 20, 256 << 20] if cuda else [1 << 20]
    reps = 40 if cuda else 3
    feeds: list[tuple[Callable[[int], Any], float | None]] = [
        (SlabFeed, 0.90), (lambda n: SocketFeed(n, chunked=True), None), (lambda n: SocketFeed(n, chunked=False), None),
    ]
    rows, failures = [], []
    for nbytes in sizes:
        raw = statistics.median(raw_h2d_gbps(nbytes, reps, device, cuda) for _ in range(3))
        for make_feed, target in feeds:
            name, rate, failed, counts = measure(lambda: make_feed(nbytes), nbytes, reps, device, cuda)
            failures += failed
            share = rate / raw
            met = ("yes" if share >= target else "no") if cuda and target is not None else "n/a"
            rows.append(f"| H2D {nbytes >> 20} MiB | staging from {name} {rate:.1f} GB/s | raw pinned {raw:.1f} GB/s | "
                        f"{share:.2f} | {f'>= {target:.2f}' if target else '-'} | {met} | "
                        f"{counts['direct']} direct, {counts['through_pool']} via pinned pool; "
                        f"{counts['calls']} registrations, {counts['failed']} refused |")
    fed, resident = step_times(device if cuda else None, 8192 if cuda else 64, 50 if cuda else 4,
                               (4, 1024, 1024) if cuda else (4, 16, 16))
    ratio = fed / resident
    rows.append(f"| step time | fed by Ferry {fed * 1e3:.2f} ms | data on device {resident * 1e3:.2f} ms | "
                f"{ratio:.3f} | <= 1.05 | {('yes' if ratio <= 1.05 else 'no') if cuda else 'n/a'} | |")
    name = torch.cuda.get_device_name() if cuda else "CPU fallback (no targets apply; registrations are bookkeeping only)"
    print(f"gpu_check on {name}\n\n| measure | Ferry | reference | ratio | target | met | copies |\n"
          f"|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if failures:
        print("\nFAILED checks:\n" + "\n".join(f"- {f}" for f in failures))
        return 1
    print(f"\nall checks passed: {CHECKED} batches per path and size equal on the device while their sources were "
          f"reused; registrations released on close")
    return 0


if __name__ == "__main__":
    sys.exit(main())
