"""Ferry on Slurm, for real: deploy/slurm's files on a Slurm cluster started on this machine (tests/slurm_cluster.py:
munged, slurmctld, a slurmd on each of three nodes, each node a network namespace with its own hostname and
address).

ferry.sbatch runs the trainer (tests/engine_trainer.py: every batch compared with torch's DataLoader) in group 0 and
two producers in group 1, on another node; CURVE keys are made by the job itself. Mid-epoch a producer task is
SIGKILLed; while the trainer holds the epoch at batch GATE, add-producers.sbatch adds a producer from a second job,
and a third job of the same script runs an intruder: a producer whose key pair was never authorized, serving a
dataset with the same fingerprint but other values, so that one batch from it fails the comparison. The epoch
must complete with every batch equal to DataLoader's, the added producer delivering, the intruder never admitted,
and every job ending by itself with exit code 0.

Opt-in (marker ``engine``: ``pytest -m engine tests/test_slurm.py``; .ci/run runs it after the suite). It installs
nothing: without root, network namespaces or Slurm and munge (``apt-get install slurm-wlm munge``) it skips, and
under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ferry.common.datasets import NpyFolderDataset

from .helpers import REPO, producer_env, wait_for
from .slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.engine, pytest.mark.netns, pytest.mark.timeout(300)]

DEPLOY = Path(REPO) / "deploy" / "slurm"
SAMPLES, BATCH, GATE = 384, 16, 8
BATCHES = SAMPLES // BATCH
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


def ferry(*args: str, env: dict[str, str] | None = None) -> None:
    out = subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True, cwd=REPO,
                         env={**producer_env(), **(env or {})}, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def poisoned_copy(data: Path, poison: Path) -> None:
    """The same files, names and sizes (so the same fingerprint), other values: an intruder's batch would differ."""
    shutil.copytree(data, poison)
    for path in poison.rglob("*.npy"):
        array = np.load(path)
        np.save(path, (array + 1).astype(array.dtype))
    assert NpyFolderDataset(str(poison)).fingerprint == NpyFolderDataset(str(data)).fingerprint


class Run:
    """The test's view of the jobs: their output, the trainer's figures, the producer processes on the nodes."""

    def __init__(self, cluster: SlurmCluster, work: Path, control: Path) -> None:
        self.cluster, self.work, self.control = cluster, work, control
        self.jobs: list[str] = []

    def submit(self, script: str, *args: str, env: dict[str, str], options: tuple[str, ...] = ()) -> str:
        job = self.cluster.sbatch(*options, str(DEPLOY / script), *args, env=env, cwd=str(self.work))
        self.jobs.append(job)
        return job

    def output(self, job: str) -> str:
        path = self.work / f"slurm-{job}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path.name} yet)"

    def report(self) -> str:
        def summary(job: str) -> str:
            return "; ".join(" ".join(f"{k}={c.get(k)}" for k in ("JobId", "JobState", "ExitCode", "NodeList"))
                             for c in self.cluster.job(job))
        outputs = "\n".join(f"=== job {job}: {summary(job)}\n{self.output(job)}" for job in self.jobs)
        return f"{outputs}\n=== trainer status: {self.status()}\n{self.cluster.logs()}"

    def status(self) -> dict:
        try:
            return json.loads((self.control / "status.json").read_text())
        except FileNotFoundError:
            return {}

    def expect(self, predicate, timeout: float, what: str):
        """Wait for ``predicate`` while the trainer's job is queued; fail with every job's output otherwise."""
        def check():
            value = predicate()
            if not value and not self.cluster.states(self.jobs[0]) & ALIVE:
                raise AssertionError(f"the trainer's job {self.jobs[0]} ended while waiting for {what}\n"
                                     f"{self.report()}")
            return value
        try:
            return wait_for(check, timeout, what, interval=0.2)
        except AssertionError as exc:
            if "timed out" in str(exc):
                raise AssertionError(f"{exc}\n{self.report()}") from None
            raise

    def producers(self, job: str) -> dict[int, str]:
        """The producer processes of ``job`` on every node (not the srun that started them): pid -> ``host:pid``,
        their name at the trainer."""
        found = {}
        for host in self.cluster.nodes:
            for pid in self.cluster.pids(host):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if argv[1:3] == [b"-m", b"ferry.producer"] and f"SLURM_JOB_ID={job}".encode() in environ:
                    found[pid] = f"{host}:{pid}"
        return found


def test_slurm_job_trains_every_batch_through_a_killed_producer_added_producers_and_an_intruder(tmp_path):
    data, poison, work, control = tmp_path / "data", tmp_path / "poison", tmp_path / "work", tmp_path / "control"
    work.mkdir()
    control.mkdir()
    cluster = SlurmCluster(tmp_path / "slurm", ["n1", "n2", "n3"])
    try:
        cluster.start()
        ferry("demo", "--data-only", "--data-dir", str(data), env={"FERRY_SAMPLES": str(SAMPLES), "FERRY_SIZE": "16"})
        poisoned_copy(data, poison)
        ferry("keys", str(tmp_path / "intruder"), "--producer", "intruder")
        env = {**producer_env(), "FERRY_PYTHON": sys.executable, "FERRY_DATASET": "npy-folder",
               "FERRY_DATASET_ARGS": json.dumps({"root": str(data)}), "FERRY_THREADS": "1",
               "FERRY_TRANSFORM": "tests.transforms:slow_identity", "FERRY_WATCH_S": "0.5"}
        run = Run(cluster, work, control)
        main = run.submit("ferry.sbatch", sys.executable, "-m", "tests.engine_trainer", str(data),
                          "--control", str(control), "--batch-size", str(BATCH), "--gate", str(GATE), env=env)
        run.expect(lambda: run.status().get("batches", 0) >= 2, 90, "the trainer's first 2 batches")

        # the trainer on group 0's node, the producers on group 1's: two hosts, two addresses
        trainer_node, producer_node = (c["NodeList"] for c in cluster.job(main))
        assert run.status()["host"] == trainer_node and producer_node != trainer_node, cluster.job(main)
        first = run.producers(main)
        assert len(first) == 2 and all(name.startswith(producer_node + ":") for name in first.values()), first

        # a producer task dies mid-epoch: the other one and the job go on
        killed = min(first)
        os.kill(killed, signal.SIGKILL)
        assert run.status()["batches"] < BATCHES
        run.expect(lambda: run.status().get("phase") == "paused" and run.status()["producers"] == 1, 60,
                   "the trainer paused at batch GATE with the killed producer gone")

        # a second job adds a producer; a third runs the intruder, whose key was never authorized
        added = run.submit("add-producers.sbatch", main, env=env, options=("--ntasks=1",))
        intruder = run.submit("add-producers.sbatch", main, options=("--ntasks=1",), env={
            **env, "FERRY_DATASET_ARGS": json.dumps({"root": str(poison)}),
            "FERRY_CURVE_KEY": str(tmp_path / "intruder" / "intruder.key_secret")})

        def admitted() -> int:
            """The producers the trainer has admitted so far; fails as soon as the intruder is among them."""
            status = run.status()
            assert status["producers_seen"] <= 3, f"a producer without an authorized key was admitted: {status}"
            return status["producers_seen"]
        run.expect(lambda: admitted() == 3 and run.status()["producers"] == 2, 60, "the added producer to join")
        run.expect(lambda: admitted() and "CURVE handshake DENIED" in run.output(main), 60,
                   "the trainer to deny the intruder's key")
        run.expect(lambda: "denied this producer's CURVE key" in run.output(intruder), 30,
                   "the intruder to log that its key was denied")
        added_names = run.expect(lambda: run.producers(added), 10, "the added producer's process")
        intruder_names = run.expect(lambda: run.producers(intruder), 10, "the intruder's process")
        (control / f"go-{GATE}").touch()

        run.expect(lambda: not cluster.states(main) & ALIVE, 90, "the trainer's job to end")
        assert cluster.states(main) == {"COMPLETED"}, run.report()
        assert f"checked {BATCHES} batches from 3 producers" in run.output(main), run.report()
        result = json.loads((control / "result.json").read_text())
        assert result["producers_seen"] == 3, result
        delivered = result["delivered"]
        survivor = first[max(first)]
        assert not set(delivered) & set(intruder_names.values()), (delivered, intruder_names)
        assert set(delivered) <= {first[killed], survivor, *added_names.values()}, delivered
        assert delivered.get(survivor, 0) > 0 and all(delivered.get(n, 0) > 0 for n in added_names.values()), delivered

        # the added jobs notice that the job they served has ended, and stop their producers (exit code 0)
        for job in (added, intruder):
            wait_for(lambda: not cluster.states(job) & ALIVE, 30, f"job {job} to end after the trainer's", interval=0.2)
            assert [c["ExitCode"] for c in cluster.job(job)] == ["0:0"], f"job {job}\n{run.report()}"
        keys = work / "ferry-slurm" / "keys"
        assert oct(keys.stat().st_mode & 0o777) == "0o700"
        assert {oct(p.stat().st_mode & 0o777) for p in keys.glob("*.key_secret")} == {"0o600"}
        assert not list((work / "ferry-slurm").glob("*.endpoint")), "the job left its endpoint file"
    finally:
        cluster.close()
