"""GPU check: the staging path against the hardware, on a CUDA machine (under 5 minutes).

    python -m benchmarks.gpu_check            # needs CUDA; measures and prints a table
    python -m benchmarks.gpu_check --cpu      # the CPU fallback: same code paths, tiny sizes, no targets

It measures, in one run:
1. H2D throughput through Ferry's staging (CudaStager: reused pinned pool, side stream, events) against
   raw pinned ``cudaMemcpyAsync`` bandwidth (``tensor.copy_(non_blocking=True)`` from one pinned buffer).
   Target: staging >= 80 % of raw.
2. The step time of a compute-bound loop fed by Ferry (local producers, device="cuda") against the same
   loop on batches already on the device. Target: <= 1.05x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from ferry import RemoteLoader
from ferry.consumer.buffer import Delivery
from ferry.consumer.staging import CpuStager, CudaStager


def raw_h2d_gbps(nbytes: int, reps: int, device: torch.device) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    return nbytes * reps / (time.perf_counter() - start) / 1e9


def staging_gbps(nbytes: int, reps: int, device: torch.device | None) -> float:
    """Feed decoded batches (host arrays, as the io thread makes them) through the stager."""
    stager = CudaStager(device) if device is not None else CpuStager(pin_memory=False)
    host = [np.full(nbytes, i, dtype=np.uint8) for i in range(4)]  # distinct sources, like fresh frames
    try:
        stager.stage(Delivery(run=0, seq=0, tree=[host[0]]))
        if device is not None:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        last = None
        for i in range(reps):
            delivery = Delivery(run=0, seq=i, tree=[host[i % 4]])
            stager.stage(delivery)
            last = delivery
        if device is not None:
            last.event.synchronize()
        return nbytes * reps / (time.perf_counter() - start) / 1e9
    finally:
        stager.close()


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
                      local_producers=2, batch_size=1, device=device, timeout=120) as loader:
        batches = list(loader)  # warm-up epoch: producers, pools, allocator
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
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        print("gpu_check: CUDA is not available; run with --cpu for the CPU fallback", file=sys.stderr)
        return 2
    device = torch.device("cuda") if cuda else None
    sizes = [16 << 20, 64 << 20, 256 << 20] if cuda else [1 << 20]
    reps = 40 if cuda else 3
    rows = []
    for nbytes in sizes:
        staged = [staging_gbps(nbytes, reps, device) for _ in range(3)]
        raw = [raw_h2d_gbps(nbytes, reps, device) for _ in range(3)] if cuda else [float("nan")]
        share = statistics.median(staged) / statistics.median(raw) if cuda else float("nan")
        rows.append(f"| H2D {nbytes >> 20} MiB | staging {statistics.median(staged):.1f} GB/s | raw pinned "
                    f"{statistics.median(raw):.1f} GB/s | {share:.2f} | >= 0.80 | "
                    f"{'yes' if share >= 0.8 else 'no' if cuda else 'n/a'} |")
    fed, resident = step_times(device, 8192 if cuda else 64, 50 if cuda else 4,
                               (4, 1024, 1024) if cuda else (4, 16, 16))
    ratio = fed / resident
    rows.append(f"| step time | fed by Ferry {fed * 1e3:.2f} ms | data on device {resident * 1e3:.2f} ms | "
                f"{ratio:.3f} | <= 1.05 | {'yes' if ratio <= 1.05 else 'no' if cuda else 'n/a'} |")
    name = torch.cuda.get_device_name() if cuda else "CPU fallback (no targets apply)"
    print(f"gpu_check on {name}\n\n| measure | Ferry | reference | ratio | target | met |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
