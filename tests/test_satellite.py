"""The satellite example runs end to end at reduced size, with producers launched separately."""

import os
import re
import subprocess
import sys

import pytest

from .helpers import REPO, free_port, producer_env


@pytest.mark.slow  # about 17 s on 2 loaded cores: the default suite stays under 5 minutes (.ci/run runs -m slow)
def test_satellite_example_trains_at_reduced_size(spawn, tmp_path):
    data = tmp_path / "sat"
    made = subprocess.run([sys.executable, "examples/satellite/make_dataset.py", str(data), "--samples", "64",
                           "--size", "67"], capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert made.returncode == 0, made.stderr
    assert sorted(os.listdir(data)) == ["0", "1"]
    port = free_port()
    spawn(f"tcp://127.0.0.1:{port}", "npy-folder", {"root": str(data)})
    run = subprocess.run([sys.executable, "examples/satellite/train.py", "--endpoint", f"tcp://127.0.0.1:{port}",
                          "--epochs", "1", "--width", "0.125", "--batch-size", "8", "--device", "cpu",
                          "--timeout", "60"], capture_output=True, text=True, env=producer_env(), cwd=REPO,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "8 batches of 8 per epoch" in run.stdout
    match = re.search(r"epoch 0: (\d+) samples, \d+ samples/s, \d+ MB/s, data stall [\d.]+ %", run.stdout)
    assert match and int(match.group(1)) == 64, run.stdout
