"""The benchmark harness runs end to end on tiny sizes, so that it cannot rot (-m slow: .ci/run runs it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, producer_env


@pytest.mark.slow  # the whole benchmark harness, 23 s (.ci/run runs -m slow)
def test_quick_harness_runs_on_tiny_sizes(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--tiny", "--out", str(tmp_path)], capture_output=True,
                         text=True, env=producer_env(), cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = list(tmp_path.glob("*-tiny.json"))
    assert len(results) == 1
    report = json.loads(results[0].read_text())
    scenarios = {row["scenario"].split()[0] for row in report["rows"]}
    assert scenarios == {"1", "2", "3", "4", "5", "6"}
    from benchmarks.scenarios import SIZES

    for row in report["rows"]:
        for values in row["raw"].values():
            assert len(values) >= SIZES["tiny"].repeats >= 2, f"fewer repeats than asked for: {row}"
    assert "| scenario | case |" in out.stdout and "Ferry / DataLoader" in out.stdout


def test_gpu_check_cpu_fallback_runs():
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu"], capture_output=True, text=True,
                         env=producer_env(), cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| H2D 1 MiB | staging" in out.stdout and "| step time | fed by Ferry" in out.stdout


@pytest.mark.slow  # scenario 8 on tiny sizes, 1.5-2.5 minutes: Ray Data's local cluster starts in every run
@pytest.mark.timeout(900)
def test_ray_data_peer_runs_on_tiny_sizes(tmp_path):
    from . import needs

    needs.module("ray", "ray")
    token = Path.home() / ".ray" / "auth_token"
    had_token = token.exists()
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--tiny", "--only", "8", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(next(tmp_path.glob("*-tiny.json")).read_text())
    rows = {row["case"].split(":")[0]: row for row in report["rows"]}
    assert set(rows) == {"epoch 0 from construction", "warm epoch", "time to first batch", "peak PSS of the process tree",
                         "CPU seconds of the process tree", "planned order kept, epochs"}
    for row in rows.values():
        assert set(row["raw"]) == {"dataloader", "ferry", "raydata"}
        assert all(len(values) >= 2 for values in row["raw"].values()), row
    # DataLoader and Ferry keep the plan they were given, every epoch; every tree was seen using memory and CPU
    order = rows["planned order kept, epochs"]["raw"]
    assert all(order["dataloader"]) and all(order["ferry"]), order
    assert all(v > 0 for s in ("peak PSS of the process tree", "CPU seconds of the process tree")
               for values in rows[s]["raw"].values() for v in values)
    assert token.exists() == had_token, "a run left a Ray token in ~/.ray (it must use one of its own)"
