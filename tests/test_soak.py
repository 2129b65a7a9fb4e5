"""Soak: producers are killed and restarted every few seconds while a slow loop trains, epoch after epoch.
Every epoch is complete and exact; consumer and producer RSS and fd counts stay flat.

The default suite runs 9 seconds, killing a producer every 0.5-1.5 s; ``pytest -m soak`` runs 10 minutes,
killing one every 1-3 s (FERRY_SOAK_SECONDS overrides).
"""

import os
import random
import time

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import ProducerProcess, reference_batches, wait_for

LENGTH = 240


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def soak(endpoint: str, spawn, seconds: float, kill_every: tuple[float, float] = (1.0, 3.0)) -> dict:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    args = {"length": LENGTH, "delay": 0.002}
    steady = spawn(endpoint, "tests.datasets:PairDataset", args, threads=2, slots=2)
    victim: ProducerProcess = spawn(endpoint, "tests.datasets:PairDataset", args, threads=2, slots=2)
    kills = 0
    figures = []
    deadline = time.monotonic() + seconds
    next_kill = time.monotonic() + rng.uniform(*kill_every)
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=seed, heartbeat=0.2, timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        epoch = 0
        while time.monotonic() < deadline:
            loader.set_epoch(epoch)
            got = []
            for x, y in loader:
                got.append(y.tolist())
                time.sleep(0.005)  # a slow training step
                if time.monotonic() > next_kill:
                    victim.kill()
                    victim.close()
                    victim = spawn(endpoint, "tests.datasets:PairDataset", args, threads=2, slots=2)
                    kills += 1
                    next_kill = time.monotonic() + rng.uniform(*kill_every)
            expected = reference_batches(PairDataset(LENGTH), batch_size=4, drop_last=False, world_size=1, rank=0,
                                         shuffle=True, seed=seed, epoch=epoch)
            assert got == [e[1].tolist() for e in expected], f"epoch {epoch} not exact (seed {seed})"
            figures.append((rss_kb(os.getpid()), fd_count(os.getpid()), rss_kb(steady.pid), fd_count(steady.pid)))
            epoch += 1
        stats = loader.stats()
    return {"epochs": epoch, "kills": kills, "figures": figures, "stats": stats, "seed": seed}


def check_flat(result: dict) -> None:
    figures = result["figures"]
    assert result["epochs"] >= 4 and result["kills"] >= 3, result
    warm = figures[len(figures) // 4]  # after warm-up
    last = figures[-1]
    consumer_rss_growth = (last[0] - warm[0]) / 1024
    producer_rss_growth = (last[2] - warm[2]) / 1024
    assert consumer_rss_growth < 48, f"consumer RSS grew {consumer_rss_growth:.1f} MB: {figures}"
    assert producer_rss_growth < 24, f"producer RSS grew {producer_rss_growth:.1f} MB: {figures}"
    assert last[1] <= warm[1] + 4, f"consumer fds grew: {figures}"
    assert last[3] <= warm[3] + 4, f"producer fds grew: {figures}"
    assert result["stats"]["reissued"] > 0


@pytest.mark.slow  # 10 s of kills; -m soak runs the 10-minute one (.ci/run runs -m slow)
def test_soak_short(endpoint, spawn):
    check_flat(soak(endpoint, spawn, float(os.environ.get("FERRY_SOAK_SHORT_SECONDS", 9)), kill_every=(0.5, 1.5)))


@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_soak_10_minutes(endpoint, spawn, capsys):
    result = soak(endpoint, spawn, float(os.environ.get("FERRY_SOAK_SECONDS", 600)))
    check_flat(result)
    first, last = result["figures"][len(result["figures"]) // 4], result["figures"][-1]
    with capsys.disabled():
        print(f"\nsoak: {result['epochs']} exact epochs, {result['kills']} producer kills, "
              f"{result['stats']['reissued']} re-issued tasks, {result['stats']['duplicates']} duplicates dropped; "
              f"consumer RSS {first[0] / 1024:.0f} -> {last[0] / 1024:.0f} MB, fds {first[1]} -> {last[1]}; "
              f"steady producer RSS {first[2] / 1024:.0f} -> {last[2] / 1024:.0f} MB, fds {first[3]} -> {last[3]}")
