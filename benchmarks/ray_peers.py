"""One system of scenario 8 (benchmarks/ray_data.py) in its own process: DataLoader, Ferry or Ray Data on the seed
workload, two epochs from construction; one JSON line on stdout.

    python -m benchmarks.ray_peers {dataloader,ferry,raydata} ROOT [--cpus 2] [--batch 32] [--seed 0] [--epochs 2]

Every system gets the same plan: each epoch's order is ``torch.randperm`` from ``(seed, epoch)``, given to
DataLoader and Ferry as a sampler and to Ray Data as the order of its items (``from_items``). Each yields
``(tensor, label, index)`` batches of :class:`~benchmarks.datasets.SeedTiles` (Ray Data: dicts of tensors from
``iter_torch_batches``); the indices it yields are compared with the plan (``order_ok``, one per epoch).

The clock starts after the imports (the same for all), before the system is built: epoch 0 counts Ray's
``ray.init`` (a local cluster of ``--cpus`` CPUs, as a script that uses Ray only to load data starts one; also
reported alone, ``init_s``), Ferry's producers' start, DataLoader's workers' start. The warm epoch is the next one,
from ``iter()`` to its last batch.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator

import torch

from .datasets import SeedTiles


def plan(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


class PlannedSampler:
    """The plan of ``set_epoch``'s epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(plan(self.n, self.seed, self.epoch))

    def __len__(self) -> int:
        return self.n


def measure(epochs: Callable[[int], Iterable[list[int]]], count: int, started: float, n: int, seed: int) -> dict:
    """Run ``count`` epochs of ``epochs(e)`` (each an iterable of batches' index lists), timing them."""
    out: dict[str, Any] = {"order_ok": []}
    for epoch in range(count):
        began = time.perf_counter()
        seen: list[int] = []
        for indices in epochs(epoch):
            if not seen and epoch == 0:
                out["first_s"] = time.perf_counter() - started
            seen += indices
        took = time.perf_counter() - (started if epoch == 0 else began)
        out["epoch0_sps" if epoch == 0 else "warm_sps"] = len(seen) / took
        out["order_ok"].append(seen == plan(n, seed, epoch))
    return out


def run_dataloader(dataset: SeedTiles, args: argparse.Namespace, started: float) -> dict:
    from torch.utils.data import DataLoader

    sampler = PlannedSampler(len(dataset), args.seed)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.cpus,
                        persistent_workers=True)

    def epoch(e: int) -> Iterator[list[int]]:
        sampler.set_epoch(e)
        return (batch[2].tolist() for batch in loader)
    return measure(epoch, args.epochs, started, len(dataset), args.seed)  # its workers stop with it, here


def run_ferry(dataset: SeedTiles, args: argparse.Namespace, started: float) -> dict:
    from ferry import RemoteLoader
    from ferry.common.constants import DEFAULT_THREADS

    sampler = PlannedSampler(len(dataset), args.seed)  # the loader calls its set_epoch
    with RemoteLoader(dataset=dataset, local_producers=args.cpus, producer_threads=DEFAULT_THREADS,
                      batch_size=args.batch, sampler=sampler, no_producer_timeout=120, log_every=None) as loader:
        return measure(lambda e: (batch[2].tolist() for batch in loader), args.epochs, started, len(dataset),
                       args.seed)


def run_raydata(dataset: SeedTiles, args: argparse.Namespace, started: float) -> dict:
    """Ray Data as its guides show it: items, ``map`` per row, ``iter_torch_batches``; its default options (among
    them ``preserve_order=False``)."""
    temp = tempfile.mkdtemp(prefix="fbr-", dir="/tmp")  # short: Ray's socket paths; removed at the end
    token = os.path.join(temp, "auth_token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secrets.token_hex(32))
    # Ray 2.60 turns token authentication on for a local cluster and would write its token into ~/.ray: one of
    # its own here, read before `import ray`, and gone with the folder
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token, RAY_USAGE_STATS_ENABLED="0")
    import ray

    try:
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
        init_s = time.perf_counter() - started
        ray.data.DataContext.get_current().enable_progress_bars = False

        def epoch(e: int) -> Iterator[list[int]]:
            items = ray.data.from_items([{"index": i} for i in plan(len(dataset), args.seed, e)])
            batches = items.map(dataset.row).iter_torch_batches(batch_size=args.batch)
            return (batch["index"].tolist() for batch in batches)
        out = measure(epoch, args.epochs, started, len(dataset), args.seed)
        out["init_s"] = init_s
        return out
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


RUNNERS = {"dataloader": run_dataloader, "ferry": run_ferry, "raydata": run_raydata}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_peers")
    parser.add_argument("system", choices=sorted(RUNNERS))
    parser.add_argument("root")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    dataset = SeedTiles(args.root)
    started = time.perf_counter()
    out = RUNNERS[args.system](dataset, args, started)
    out["samples"] = len(dataset)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
