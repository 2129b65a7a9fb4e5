"""docs/deployment.md's sweep runs as written, at reduced size: one pool of producers without a dataset of their own,
three trials (examples/sweep/trial.py) naming the same dataset, one weighted 2."""

import re
import socket
import subprocess
import sys

import pytest

from .helpers import REPO, free_port, producer_env


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that are free now (a port range, as the docs use)."""
    for _ in range(50):
        base, held = free_port(), []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports")


@pytest.mark.slow  # the example end to end, 8 s (.ci/run runs -m slow); the pool's rules have tests of their own
def test_three_trials_share_one_pool(spawn):
    first = consecutive_free_ports(3)
    ports = [first, first + 1, first + 2]
    pool = f"tcp://127.0.0.1:{first}-{first + 2}"
    for _ in range(2):
        spawn(pool, "", threads=4, slots=2)
    trials = [subprocess.Popen([sys.executable, "examples/sweep/trial.py", "--endpoint", f"tcp://127.0.0.1:{port}",
                                "--lr", str(lr), "--epochs", "2", "--samples", "512", *extra], cwd=REPO,
                               env=producer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for port, lr, extra in zip(ports, (0.1, 0.03, 0.01), ([], [], ["--weight", "2"]))]
    try:
        for trial, lr in zip(trials, ("0.1", "0.03", "0.01")):
            out, err = trial.communicate(timeout=180)
            assert trial.returncode == 0, err[-3000:]
            assert len(re.findall(rf"trial lr={lr} .*: epoch \d: 8 batches, mean loss", out)) == 2, out
            assert f"trial lr={lr}: done" in out
    finally:
        for trial in trials:
            if trial.poll() is None:
                trial.kill()
            trial.wait(10)
