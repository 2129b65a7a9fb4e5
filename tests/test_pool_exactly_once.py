"""Exactly once per job in a shared pool, with real processes: every job's every epoch is exactly its DataLoader
order while a producer is SIGKILLed, a job joins and leaves, and the pool grows and shrinks; and across network
namespaces (the trainers on one 'host', most of the pool on another)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from ferry import RemoteLoader
from ferry.common.datasets import SyntheticDataset
from tests.datasets import PairDataset
from tests.helpers import REPO, assert_tree_equal, free_port, producer_env, reference_batches, wait_for
from tests.netns import make_hosts

ALLOW = ["--allow-dataset", "tests.datasets:PairDataset"]


class CheckedJob:
    """A job in a thread of its own that runs ``epochs`` epochs, each compared batch by batch with DataLoader's."""

    def __init__(self, spec: str, args: dict[str, Any], dataset: Any, *, batch_size: int, seed: int, epochs: int,
                 weight: float = 1.0) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.loader = RemoteLoader(endpoint=self.endpoint, dataset=spec, dataset_args=args, batch_size=batch_size,
                                   shuffle=True, seed=seed, weight=weight, heartbeat=0.2, timeout=60, log_every=None)
        self.expected = [reference_batches(dataset, batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                                           shuffle=True, seed=seed, epoch=e) for e in range(epochs)]
        self.batches, self.epochs_done = 0, 0
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"job-{seed}")

    def _run(self) -> None:
        try:
            for epoch, expected in enumerate(self.expected):
                self.loader.set_epoch(epoch)
                count = 0
                for seq, batch in enumerate(self.loader):
                    assert_tree_equal(batch, expected[seq], f"epoch {epoch} batch {seq}")
                    count += 1
                    self.batches += 1
                assert count == len(expected), f"epoch {epoch}: {count} batches, DataLoader has {len(expected)}"
                self.epochs_done += 1
        except BaseException as exc:  # seen by the test, never lost in a thread
            self.failure = exc

    def finish(self, timeout: float = 120.0) -> None:
        self.thread.join(timeout)
        alive = self.thread.is_alive()
        self.reissued = self.loader.stats()["reissued"]
        self.loader.close()
        assert not alive, "the job did not finish"
        if self.failure is not None:
            raise self.failure
        assert self.epochs_done == len(self.expected)


@pytest.mark.slow  # 22 s; the namespace test below keeps a SIGKILL and a resize in the default suite (.ci/run runs -m slow)
def test_every_jobs_epochs_are_dataloaders_through_a_sigkill_a_join_a_leave_and_a_resize(spawn):
    synthetic = {"length": 160, "shape": [2], "dtype": "float32", "delay": 0.03}
    pairs = {"length": 120, "delay": 0.03}
    a = CheckedJob("synthetic", synthetic, SyntheticDataset(**synthetic), batch_size=4, seed=1, epochs=2)
    b = CheckedJob("tests.datasets:PairDataset", pairs, PairDataset(**pairs), batch_size=5, seed=2, epochs=2)
    joining_args = dict(synthetic, length=60)
    joining = CheckedJob("synthetic", joining_args, SyntheticDataset(**joining_args), batch_size=3, seed=3, epochs=1,
                         weight=2.0)
    endpoints = [a.endpoint, b.endpoint, joining.endpoint]  # the joining job's endpoint waits for it to bind
    pool = [spawn(endpoints, "", threads=8, slots=2, extra=ALLOW) for _ in range(2)]
    try:
        a.thread.start(), b.thread.start()
        wait_for(lambda: a.batches >= 5 and b.batches >= 5, 60, "both jobs under way")
        pool[0].kill()  # SIGKILL: its tasks are re-issued to the others
        pool.append(spawn(endpoints, "", threads=8, slots=2, extra=ALLOW))  # the pool grows
        wait_for(lambda: a.batches >= 20, 60, "the first job past the kill")
        joining.thread.start()  # a job joins, runs its epoch and leaves
        joining.finish()
        pool[1].terminate()  # the pool shrinks: BYE, its tasks re-issued without an attempt
        a.finish()
        b.finish()
    finally:
        for job in (a, b, joining):
            job.loader.close()  # idempotent: a job that failed before finish() is closed here
    assert a.reissued + b.reissued > 0  # the kill and the shrink took tasks from them: re-issued, each once
    assert pool[2].proc.poll() is None


@pytest.fixture
def hosts():
    h = make_hosts("pool")
    yield h
    h.close()


@pytest.mark.netns
def test_every_jobs_epochs_are_dataloaders_across_namespaces_through_a_sigkill_and_a_resize(hosts, spawn):
    jobs = [(f"tcp://{hosts.addr_a}:5555", "synthetic", {"length": 120, "shape": [3], "delay": 0.02}, 4, 1, 1.0),
            (f"tcp://{hosts.addr_a}:5556", "tests.datasets:PairDataset", {"length": 90, "delay": 0.02}, 3, 2, 2.0)]
    trainers = [subprocess.Popen(
        ["ip", "netns", "exec", hosts.a, sys.executable, "-m", "tests.pool_trainer", endpoint, spec, json.dumps(args),
         str(batch), str(seed), "2", str(weight)], cwd=REPO, env=producer_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for endpoint, spec, args, batch, seed, weight in jobs]
    endpoints = [job[0] for job in jobs]
    try:
        far = [spawn(endpoints, "", threads=8, slots=2, netns=hosts.b, extra=ALLOW) for _ in range(2)]
        first = trainers[0].stdout.readline()  # a batch has crossed the link
        assert first and json.loads(first)["epoch"] == 0
        far[0].kill()
        spawn(endpoints, "", threads=8, slots=2, netns=hosts.a, extra=ALLOW)  # the pool grows on the trainers' host
        outputs = [trainer.communicate(timeout=120) for trainer in trainers]
        for trainer, (out, err) in zip(trainers, outputs):
            assert trainer.returncode == 0, err[-3000:]
            ends = [json.loads(line) for line in out.splitlines() if '"end"' in line]
            assert [e["end"] for e in ends] == [0, 1], out[-2000:]
        assert far[1].proc.poll() is None
    finally:
        for trainer in trainers:
            if trainer.poll() is None:
                trainer.kill()
            trainer.wait(10)
