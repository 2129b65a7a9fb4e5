"""Multi-host behaviour over real network namespaces: a cut link, and producers on 'another host'."""

import json
import subprocess
import sys

import pytest

from tests.datasets import PairDataset

from .helpers import REPO, producer_env, reference_batches
from .netns import make_hosts

pytestmark = pytest.mark.netns


@pytest.fixture
def hosts():
    h = make_hosts("cut")
    yield h
    h.close()


class Trainer:
    def __init__(self, hosts, endpoint, length, step):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", hosts.a, sys.executable, "-m", "tests.netns_trainer", endpoint, str(length),
             str(step)], cwd=REPO, env=producer_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.epochs: dict[int, list] = {}
        self.ended: list[int] = []
        self.last: dict = {}

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, "the trainer exited early"
        record = json.loads(line)
        if "labels" in record:
            self.epochs.setdefault(record["epoch"], []).append(record["labels"])
            self.last = record
        elif "end" in record:
            self.ended.append(record["end"])
        return record

    def read_until(self, predicate, what, limit=3000):
        recent = []
        for _ in range(limit):
            record = self.read()
            recent = (recent + [record])[-5:]
            if predicate(record):
                return record
        raise AssertionError(f"{what} did not happen within {limit} lines; last lines {recent}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stdin.close()


def test_cut_link_reissues_and_rejoins_on_a_fresh_connection(hosts, spawn):
    """The batches the far producer was sending when the link was cut never arrive late: cut longer than the liveness
    window, its connection is given up on both sides (common/deadlinks.py), and it rejoins on a fresh one. (Before,
    the old connection was kept, and they came late, to be dropped as duplicates: tests/test_task_ownership.py
    covers that dropping.)"""
    length = 400
    endpoint = f"tcp://{hosts.addr_a}:5555"
    trainer = Trainer(hosts, endpoint, length, step=0.01)
    try:
        args = {"length": length, "delay": 0.004}
        spawn(endpoint, "tests.datasets:PidDataset", args, threads=2, slots=2, netns=hosts.a)
        far = spawn(endpoint, "tests.datasets:PidDataset", args, threads=2, slots=2, netns=hosts.b)
        # `ip netns exec` execs the producer in place, so the pid it reports is far.pid
        from_far = lambda r: r.get("pid") == far.pid  # noqa: E731
        trainer.read()  # {"len": ...}
        trainer.read_until(lambda r: r.get("producers") == 2, "both producers joining")
        trainer.read_until(from_far, "a batch from the far producer (across the link)")
        hosts.partition(True)
        cut = trainer.read_until(lambda r: r.get("producers") == 1 and r["reissued"] > 0,
                                 "the far producer's loss and its tasks' re-issue")
        # keep the link down well past the liveness timeout (5 x 0.2 s): 50 more steps of 10 ms or more
        for _ in range(50):
            trainer.read()
        hosts.partition(False)
        trainer.read_until(lambda r: r.get("producers") == 2 and r["seen"] >= 3, "the far producer to rejoin")
        back = trainer.read_until(from_far, "work for the rejoined far producer")
        assert back["duplicates"] == 0, "batches made before the cut arrived late: its old connection was kept"
        trainer.proc.stdin.write("stop\n")
        trainer.proc.stdin.flush()
        for line in trainer.proc.stdout:  # to the end of the current epoch
            record = json.loads(line)
            if "labels" in record:
                trainer.epochs.setdefault(record["epoch"], []).append(record["labels"])
            elif "end" in record:
                trainer.ended.append(record["end"])
        assert trainer.proc.wait(60) == 0
        assert back["reissued"] >= cut["reissued"] > 0
        assert trainer.ended, "no epoch completed"
        for epoch in trainer.ended:
            expected = reference_batches(PairDataset(length), batch_size=4, drop_last=False, world_size=1, rank=0,
                                         shuffle=True, seed=8, epoch=epoch)
            assert trainer.epochs[epoch] == [e[1].tolist() for e in expected], f"epoch {epoch} lost or duplicated"
        assert far.proc.poll() is None
    except AssertionError as exc:
        logs = "\n".join(f"--- producer {p.pid} ---\n{p.output()[-2000:]}" for p in spawned(spawn))
        raise AssertionError(f"{exc}\n{logs}") from None
    finally:
        trainer.close()


def spawned(spawn):
    return getattr(spawn, "started", [])
