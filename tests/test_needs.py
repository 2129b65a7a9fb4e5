"""The README's test command passes on a machine without the optional packages and tools (issue 30, point 4): a test
that needs one skips there, saying why, and fails under ``CI=true``, where .ci/run installed everything. Checked by
running real pytest sessions on the suite's own tests with the package hidden (an import that fails) or the tool
off PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, producer_env

pytestmark = pytest.mark.slow  # pytest sessions of their own (.ci/run runs -m slow)


def _pytest(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rs",
                           "-m", "slow or not slow", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)


def _without(module: str, tmp_path) -> dict[str, str]:
    """An environment where ``import module`` fails, as where it is not installed."""
    blocker = tmp_path / "hidden" / module
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(f"raise ImportError('{module} is hidden by tests/test_needs.py')\n")
    env = producer_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hidden"), env["PYTHONPATH"]])
    env.pop("CI", None)
    return env


PROMETHEUS_TESTS = ["tests/test_pool_metrics.py", "tests/test_top.py::test_ferry_top_shows_each_job_of_a_real_pool",
                    "tests/test_metrics.py"]


@pytest.mark.timeout(600)
def test_the_tests_needing_prometheus_client_skip_without_it_and_fail_under_ci(tmp_path):
    env = _without("prometheus_client", tmp_path)
    run = _pytest(PROMETHEUS_TESTS, env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "prometheus_client is not installed (pip install 'ferry[metrics]')" in run.stdout
    assert " passed" not in run.stdout and " failed" not in run.stdout and " error" not in run.stdout, run.stdout
    run = _pytest(PROMETHEUS_TESTS, {**env, "CI": "true"})
    assert run.returncode != 0 and "CI=true, but prometheus_client is not installed" in run.stdout, run.stdout
    assert " skipped" not in run.stdout, run.stdout


@pytest.mark.timeout(600)
def test_the_cut_link_test_skips_without_iptables_and_fails_under_ci(tmp_path):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the cut-link test itself needs root and ip (network namespaces) before it needs iptables")
    bin_dir = tmp_path / "bin"  # ip and python, but no iptables
    bin_dir.mkdir()
    (bin_dir / "ip").symlink_to(shutil.which("ip"))
    env = producer_env()
    env.pop("CI", None)
    env["PATH"] = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    if shutil.which("iptables", path=env["PATH"]) is not None:
        pytest.skip("iptables is on /usr/bin or /bin here: it cannot be hidden")
    target = "tests/test_netns.py::test_cut_link_reissues_and_rejoins_on_a_fresh_connection"
    run = _pytest([target], env)
    assert run.returncode == 0 and "iptables is not installed (apt-get install iptables)" in run.stdout, \
        run.stdout + run.stderr
    run = _pytest([target], {**env, "CI": "true"})
    assert run.returncode != 0 and "CI=true, but iptables is not installed" in run.stdout, run.stdout
