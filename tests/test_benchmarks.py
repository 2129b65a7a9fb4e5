"""The benchmark harness runs end to end on tiny sizes, so that it cannot rot (-m slow: .ci/run runs it)."""

import json
import subprocess
import sys

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
