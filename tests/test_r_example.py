"""The seed's R loop, ported (examples/r-satellite, issue 34), end to end at reduced size with real R: the data made
as the seed's script makes it, 2 epochs read by R's own readRDS loop and through ferry relay, each batch's load wait
printed, and both means. Timing is not asserted here (docs/performance.md holds the measurement); what is: every
batch of both epochs came, with the seed's dims, and the relay stopped with the loop."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from . import needs
from .helpers import REPO, producer_env, wait_for
from .rds_files import rscript


@pytest.mark.slow
def test_the_r_satellite_example_runs_both_loops_over_two_epochs(tmp_path):
    needs.module("rdata", "rds")
    root = str(tmp_path / "tiles")
    made = subprocess.run([rscript(), os.path.join(REPO, "examples", "r-satellite", "make_data.R"), root, "16", "29"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert sorted(os.listdir(root)) == ["0", "1"] and len(os.listdir(os.path.join(root, "0"))) == 16
    env = producer_env()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # this ferry command
    run = subprocess.run([rscript(), os.path.join(REPO, "examples", "r-satellite", "train.R"), root, "8", "2", "0"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    for way in ("readRDS", "ferry  "):
        for epoch in (0, 1):
            waits = re.findall(rf"{way} epoch {epoch} batch (\d+): load wait [\d.]+ s", run.stdout)
            assert [int(b) for b in waits] == [1, 2, 3, 4], (way, epoch, run.stdout)
    assert re.search(r"mean load wait per batch: readRDS [\d.]+ s, ferry [\d.]+ s \(2 producers, batch 8", run.stdout)
    wait_for(lambda: not relays_of(root), 30, "the relay's exit (ferry_close(loader, stop_relay = TRUE))")


def relays_of(root: str) -> list[int]:
    """The processes whose command line names ``root`` (the relay and its producers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"root={root}".encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found
