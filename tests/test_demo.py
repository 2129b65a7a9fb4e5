"""Acceptance 6 (in part): `ferry demo` runs to completion and reports throughput and stall; it never destroys
(issue 11): a user's folder is refused untouched, and every flag is checked before any data is written."""

import os
import subprocess
import sys

import pytest

from tests import needs

from ferry.cli import main
from ferry.demo import COMPLETE_MARKER, OWNER_MARKER

from .helpers import REPO, free_port, producer_env, wait_for


def test_demo_runs_at_small_size():
    out = subprocess.run([sys.executable, "-m", "ferry", "demo", "--samples", "96", "--size", "16",
                          "--batch-size", "16", "--epochs", "2"], capture_output=True, text=True,
                         env=producer_env(), cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "epoch 0: 96 samples" in out.stdout and "epoch 1: 96 samples" in out.stdout
    assert "samples/s" in out.stdout and "data stall" in out.stdout
    assert "done" in out.stdout


def _scrape(port: int) -> str:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return answer.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return ""


@pytest.mark.slow  # a second demo run (the first is test_demo_runs_at_small_size); .ci/run runs -m slow
def test_the_demo_publishes_the_demand_gauge_on_its_metrics_port():
    """FERRY_METRICS_PORT (--metrics-port): the demo as an engine's trainer publishes the loader's metrics, among
    them ferry_producers_needed, the gauge KEDA scales producers on (deploy/kubernetes). It waits here for a
    producer that never comes."""
    needs.module("prometheus_client", "metrics")
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "ferry", "demo", "--producers", "0", "--min-producers", "1",
                             "--endpoint", f"tcp://127.0.0.1:{free_port()}", "--timeout", "60"],
                            env={**producer_env(), "FERRY_METRICS_PORT": str(port)}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: demo.poll() is None and _scrape(port), 30, "the demo's metrics endpoint")
        # ferry_producers_needed comes once the loop has waited (None before); the loader's gauges are there
        assert "ferry_producers_connected 0" in text.replace(".0", ""), text
    finally:
        demo.terminate()
        demo.communicate(timeout=30)


# --- the demo never destroys (issue 11, item 8) ----------------------------------------------------------
def _snapshot(folder):
    """Every entry under ``folder`` with its bytes and modification time."""
    found = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(base, name)
            content = None
            if name in files:
                with open(path, "rb") as f:
                    content = f.read()
            found[os.path.relpath(path, folder)] = (os.stat(path).st_mtime_ns, content)
    return found


@pytest.mark.parametrize("extra", [[], ["--data-only"]], ids=["train", "data-only"])
def test_a_folder_holding_a_users_file_is_left_unchanged_and_nothing_is_added(tmp_path, extra):
    (tmp_path / "thesis.tex").write_text("years of work")
    (tmp_path / "0").mkdir()  # even a folder that looks like a class folder
    before = _snapshot(tmp_path)
    out = subprocess.run([sys.executable, "-m", "ferry", "demo", "--data-dir", str(tmp_path), "--samples", "8",
                          "--size", "4", *extra], capture_output=True, text=True, env=producer_env(), cwd=REPO,
                         timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "did not write" in lines[0], out.stderr
    assert "wrote" not in out.stdout
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("flag, value", [("--samples", "0"), ("--batch-size", "0"), ("--threads", "0"),
                                         ("--size", "0"), ("--channels", "0"), ("--epochs", "0"),
                                         ("--producers", "-1"), ("--min-producers", "-1"), ("--timeout", "0"),
                                         ("--seed", "-1")])
def test_every_flag_is_checked_before_any_data_is_written(tmp_path, capsys, flag, value):
    target = tmp_path / "data"
    assert main(["demo", "--data-dir", str(target), "--samples", "8", "--size", "4", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and value in err[0], err
    assert not target.exists()


def test_a_bad_environment_value_is_a_one_line_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FERRY_SAMPLES", "lots")
    with pytest.raises(SystemExit) as info:
        main(["demo", "--data-dir", str(tmp_path / "data")])
    assert info.value.code == 2
    assert "invalid int value: 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_a_missing_or_empty_folder_is_filled_and_a_folder_of_its_own_is_reused(tmp_path, capsys):
    missing, empty = tmp_path / "new" / "data", tmp_path / "empty"
    empty.mkdir()
    for target in (missing, empty):
        assert main(["demo", "--data-only", "--data-dir", str(target), "--samples", "6", "--size", "4"]) == 0
        assert {OWNER_MARKER, COMPLETE_MARKER, "0", "1"} == set(os.listdir(target))
        assert len(os.listdir(target / "0")) + len(os.listdir(target / "1")) == 6
    capsys.readouterr()
    assert main(["demo", "--data-only", "--data-dir", str(empty), "--samples", "6", "--size", "4"]) == 0
    assert "using the dataset" in capsys.readouterr().out


def test_a_folder_the_demo_began_earlier_is_filled_again(tmp_path):
    (tmp_path / OWNER_MARKER).touch()  # an earlier run was interrupted after its marker, before the last tile
    (tmp_path / "0").mkdir()
    assert main(["demo", "--data-only", "--data-dir", str(tmp_path), "--samples", "4", "--size", "4"]) == 0
    assert (tmp_path / COMPLETE_MARKER).exists()
