"""Acceptance 6 (in part): `ferry demo` runs to completion and reports throughput and stall."""

import subprocess
import sys

from .helpers import REPO, producer_env


def test_demo_runs_at_small_size():
    out = subprocess.run([sys.executable, "-m", "ferry", "demo", "--samples", "96", "--size", "16",
                          "--batch-size", "16", "--epochs", "2"], capture_output=True, text=True,
                         env=producer_env(), cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "epoch 0: 96 samples" in out.stdout and "epoch 1: 96 samples" in out.stdout
    assert "samples/s" in out.stdout and "data stall" in out.stdout
    assert "done" in out.stdout
