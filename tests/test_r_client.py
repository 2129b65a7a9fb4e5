"""The R client with real R (issue 34): ``Rscript`` drives a real ``ferry relay`` over files that R's own saveRDS
wrote, and gets two epochs element for element equal to ``DataLoader(sampler=DistributedSampler(...))`` over the same
files in Python, through a producer killed mid-epoch and a dropped connection; after its R process is killed, a new
one resumes from the state it saved. Another protocol version is refused with the relay's reason, and a sample's
error reaches R as a condition of its Python classes, with the remote traceback. R's own unit tests of the client
run in the default suite; the runs with a relay take seconds each and run with ``-m slow`` (.ci/run runs them)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from ferry.common.datasets import RdsFolderDataset

from . import needs
from .helpers import REPO, producer_env, reference_batches, wait_for
from .rds_files import rscript, write_class_folders

SHAPE = (3, 4, 5)
R_LOOP = os.path.join(REPO, "tests", "r_loop.R")


def test_the_r_clients_own_tests_pass():
    done = subprocess.run([rscript(), "--vanilla", os.path.join(REPO, "clients", "r", "tests", "run.R")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    passed, failed = map(int, re.search(r"(\d+) passed, (\d+) failed", done.stdout).groups())
    assert failed == 0 and passed >= 20, done.stdout


class RelayProcess:
    """``ferry relay`` as a process of its own, as an R user starts it."""

    def __init__(self, tmp_path, *flags: str) -> None:
        self.connection = str(tmp_path / "relay.conn")
        self.log = open(tmp_path / "relay.log", "w")
        self.process = subprocess.Popen([sys.executable, "-m", "ferry", "relay", "--connection-file", self.connection,
                                         *flags], env=producer_env(), cwd=REPO, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(self.connection) or self.process.poll() is not None, 90, "the relay")
        assert self.process.poll() is None, (tmp_path / "relay.log").read_text()

    def children(self) -> list[int]:
        pids = []
        for task in os.listdir(f"/proc/{self.process.pid}/task"):
            with open(f"/proc/{self.process.pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        return pids

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def lines_in(path: str) -> int:
    """How many lines a file has (0 while it does not exist)."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.readlines())


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def r_loop(connection: str, out: str, epochs: int, *flags: str) -> subprocess.Popen:
    os.makedirs(out, exist_ok=True)
    return subprocess.Popen([rscript(), "--vanilla", R_LOOP, connection, out, str(epochs), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def r_batches(out: str) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """What an R loop recorded: (epoch, batch, x, y), x rebuilt from R's column-major values with R's dims."""
    x = np.fromfile(os.path.join(out, "x.bin"), np.float64)
    y = np.fromfile(os.path.join(out, "y.bin"), np.float64)
    batches, at_x, at_y = [], 0, 0
    with open(os.path.join(out, "log")) as f:
        for line in f:
            epoch, k, nx, ny, dims = line.split()
            dims = tuple(int(d) for d in dims.split(","))
            batches.append((int(epoch), int(k), x[at_x:at_x + int(nx)].reshape(dims, order="F"),
                            y[at_y:at_y + int(ny)]))
            at_x, at_y = at_x + int(nx), at_y + int(ny)
    return batches


def expected(root: str, epochs: range, **plan) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    dataset = RdsFolderDataset(root, shape=list(SHAPE))
    out = []
    for epoch in epochs:
        for k, (x, y) in enumerate(reference_batches(dataset, epoch=epoch, **plan)):
            out.append((epoch, k, x.numpy().astype(np.float64), y.numpy().astype(np.float64)))
    return out


def assert_batches(got, want) -> None:
    assert [(e, k) for e, k, _, _ in got] == [(e, k) for e, k, _, _ in want]
    for (epoch, k, x, y), (_, _, x_want, y_want) in zip(got, want):
        assert x.shape == x_want.shape, (epoch, k, x.shape)
        assert np.array_equal(x, x_want), f"epoch {epoch} batch {k}: R's x[i, j, k, l] differs from the batch's"
        assert np.array_equal(y, y_want), f"epoch {epoch} batch {k}: labels {y} != {y_want}"


PLAN = {"batch_size": 2, "drop_last": False, "world_size": 2, "rank": 1, "shuffle": True, "seed": 7}
FLAGS = ["--local-producers", "2", "--batch-size", "2", "--shuffle", "--seed", "7", "--option", "rank=1",
         "--option", "world_size=2", "--option", "log_every=null", "--option", "no_producer_timeout=60"]


@pytest.fixture
def tiles(tmp_path):
    needs.module("rdata", "rds")
    root = str(tmp_path / "tiles")
    write_class_folders(root, SHAPE, 20)  # 40 files, as R's saveRDS writes them: gzip, named .png
    return root


@pytest.mark.slow
def test_r_gets_two_epochs_exactly_dataloaders_through_a_producer_killed_mid_epoch(tmp_path, tiles):
    relay = RelayProcess(tmp_path, "--dataset", "tests.rds_files:SlowRdsFolder", "--dataset-arg", f"root={tiles}",
                         "--dataset-arg", "shape=3,4,5", "--dataset-arg", "delay=0.3", *FLAGS)
    out = str(tmp_path / "r")
    try:
        loop = r_loop(relay.connection, out, 2, "drop-after-13")
        wait_for(lambda: lines_in(os.path.join(out, "log")) >= 3, 90, "R's third batch")
        producers = relay.children()
        assert len(producers) == 2
        os.kill(producers[0], signal.SIGKILL)  # mid-epoch 0 (10 batches each), with tasks in flight
        output, _ = loop.communicate(timeout=120)
        assert loop.returncode == 0, output
    finally:
        relay.close()
    assert_batches(r_batches(out), expected(tiles, range(2), **PLAN))
    stats = read_json(os.path.join(out, "stats.json"))
    assert stats["loader"]["reissued"] >= 1  # the killed producer's tasks went to the other
    assert stats["relay"]["clients"] == 2  # the dropped connection came back (after batch 13, in epoch 1)


@pytest.mark.slow
def test_a_new_r_process_resumes_from_the_state_the_killed_one_saved(tmp_path, tiles):
    relay = RelayProcess(tmp_path, "--dataset", "rds-folder", "--dataset-arg", f"root={tiles}", "--dataset-arg",
                         "shape=3,4,5", *FLAGS)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    try:
        loop = r_loop(relay.connection, first, 2, "step-0.2")  # 20 batches take R 4 s: the kill lands mid-run
        wait_for(lambda: lines_in(os.path.join(first, "log")) >= 14, 90, "R's 14th batch")
        loop.send_signal(signal.SIGKILL)  # in epoch 1
        loop.communicate(timeout=30)
        state = read_json(os.path.join(first, "state"))
        os.makedirs(second)
        with open(os.path.join(second, "state"), "w") as f:
            json.dump(state, f)
        loop = r_loop(relay.connection, second, 2, "resume")
        output, _ = loop.communicate(timeout=120)
        assert loop.returncode == 0, output
    finally:
        relay.close()
    before = [b for b in r_batches(first) if (b[0], b[1]) < (state["epoch"], state["batches_delivered"])]
    assert 13 <= len(before) < 20  # killed in epoch 1: the second process has batches to resume
    assert_batches(before + r_batches(second), expected(tiles, range(2), **PLAN))


@pytest.mark.slow
def test_r_is_refused_by_another_version_and_gets_a_samples_error_with_its_remote_traceback(tmp_path):
    relay = RelayProcess(tmp_path, "--dataset", "tests.datasets:FailingDataset", "--dataset-arg", "length=8",
                         "--dataset-arg", "bad=[2]", "--local-producers", "1", "--batch-size", "2",
                         "--option", "log_every=null")
    code = f"""
        source('{REPO}/clients/r/R/ferry.R')
        refused <- tryCatch(ferry_loader('{relay.connection}', .version = 2L), ferry_refused = conditionMessage)
        cat('REFUSED:', refused, '\\n')
        loader <- ferry_loader('{relay.connection}')
        print(ferry_next(loader)[[2]])
        e <- tryCatch(ferry_next(loader), ferry_RemoteSampleError = function(e) e)
        cat('CLASSES:', class(e), '\\n')
        cat('INDEX:', e$index, '\\n')
        cat('TRACEBACK:', grepl('corrupt sample 2', e$traceback), '\\n')
        print(ferry_next(loader)[[2]])
        ferry_close(loader)
    """
    try:
        done = subprocess.run([rscript(), "--vanilla", "-e", code], capture_output=True, text=True, timeout=120)
    finally:
        relay.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REFUSED: the relay refused this client: this relay speaks the ferry relay protocol version 1, the client " \
           "version 2" in done.stdout
    assert "ferry_ValueError" in done.stdout and "ferry_RemoteSampleError" in done.stdout
    assert "INDEX: 1" in done.stdout and "TRACEBACK: TRUE" in done.stdout
    assert re.search(r"\[1\] 0 1\n.*\[1\] 4 5", done.stdout, re.S)
