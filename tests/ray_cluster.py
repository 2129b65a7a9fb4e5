"""A real Ray cluster on this machine, for tests/test_ray.py (root only).

Two nodes, each a network namespace on one bridge (tests/netns.Network): the head (``head``, also where the
training script runs, as a Ray driver) and a worker (``worker``). Each node is ``ray start --block`` in its
namespace, in a process group of its own (``setsid``), with a temporary folder of its own under one short folder
(Ray puts unix sockets there, whose paths must stay under 108 bytes). Token authentication is on for every process
(``RAY_AUTH_MODE=token``, the token in a file of the cluster's own through ``RAY_AUTH_TOKEN_PATH``: nothing in
``~/.ray``). ``close()`` stops both process groups (SIGTERM, then SIGKILL), kills whatever is left in the
namespaces, removes the namespaces and the folder, and says what it had to kill.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .helpers import REPO, wait_for
from .netns import cannot_run, make_network

HEAD, WORKER = "head", "worker"
#: the head's GCS port inside its namespace
GCS_PORT = 6390
#: logical CPUs each node offers (scheduling only: the machine's 2 cores are shared by both)
NODE_CPUS = 4
#: each node's object store, small: batches never go through it [Unit: byte]
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def ray_command() -> str | None:
    """The ``ray`` command of the Python running the tests (its scripts folder first), or None."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else shutil.which("ray")


class RayCluster:
    """Start with ``start()``; ``close()`` always (it undoes whatever part of the start happened)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="fray-", dir="/tmp"))  # short: Ray's socket paths
        self.net = None
        self.nodes: dict[str, subprocess.Popen] = {}
        self.token_path = self.folder / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)

    @property
    def address(self) -> str:
        return f"{self.net.addr[HEAD]}:{GCS_PORT}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of every process of the cluster and of its drivers: token authentication on, the
        cluster's own token, the repository importable (the tests' datasets), no usage reporting."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
               "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
               "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_AUTH_TOKEN", None)
        env.pop("RAY_ADDRESS", None)
        return {**env, **(extra or {})}

    # --- start -----------------------------------------------------------------------------------------
    def start(self) -> None:
        if os.geteuid() != 0:
            cannot_run("a Ray cluster of network namespaces needs root")
        ray = ray_command()
        if ray is None or importlib.util.find_spec("ray") is None:
            cannot_run("Ray is not installed (pip install 'ferry[ray]'; .ci/run installs it)")
        self.net = make_network([HEAD, WORKER])
        common = ["--num-cpus", str(NODE_CPUS), "--object-store-memory", str(OBJECT_STORE_BYTES),
                  "--disable-usage-stats", "--block"]
        self._start(HEAD, [ray, "start", "--head", f"--node-ip-address={self.net.addr[HEAD]}",
                           f"--port={GCS_PORT}", "--include-dashboard=false", *common])
        wait_for(lambda: self._started(HEAD), 90, "the Ray head to start", interval=0.2)
        self._start(WORKER, [ray, "start", f"--address={self.address}",
                             f"--node-ip-address={self.net.addr[WORKER]}", *common])
        wait_for(lambda: self._started(WORKER), 90, "the Ray worker node to start", interval=0.2)

    def _start(self, node: str, argv: list[str]) -> None:
        temp = self.folder / node
        temp.mkdir()
        with open(self.folder / f"{node}.out", "wb") as log:
            self.nodes[node] = subprocess.Popen(
                ["ip", "netns", "exec", self.net.ns[node], *argv, f"--temp-dir={temp}"], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(), cwd=REPO, start_new_session=True)

    def _started(self, node: str) -> bool:
        code = self.nodes[node].poll()
        if code is not None:
            raise AssertionError(f"ray start on {node} exited with {code}:\n{self.logs()}")
        return "Ray runtime started" in (self.folder / f"{node}.out").read_text(errors="replace")

    # --- use -------------------------------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``argv`` in ``node``'s namespace (a driver: the cluster's environment), its output in ``log``."""
        with open(log, "wb") as out:
            return subprocess.Popen(["ip", "netns", "exec", self.net.ns[node], *argv], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(env), cwd=REPO,
                                    start_new_session=True)

    def pids(self, node: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.net.ns[node]], capture_output=True, text=True, timeout=10)
        return [int(p) for p in out.stdout.split()]

    def logs(self, lines: int = 40) -> str:
        text = []
        for path in sorted(self.folder.glob("*.out")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            text.append(f"--- the end of {path.name}\n" + "\n".join(tail))
        return "\n".join(text)

    # --- stop ------------------------------------------------------------------------------------------
    def close(self) -> dict[str, list[int]]:
        """Stop everything; returns the processes that were still running in each namespace after the nodes'
        process groups were stopped (SIGKILLed then), for the test to assert on."""
        left: dict[str, list[int]] = {}
        try:
            for process in self.nodes.values():
                _signal_group(process, signal.SIGTERM)
            for process in self.nodes.values():
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    _signal_group(process, signal.SIGKILL)
                    process.wait(10)
            if self.net is not None:
                left = {node: pids for node in (HEAD, WORKER) if (pids := self._kill_all(node))}
        finally:
            if self.net is not None:
                self.net.close()
                self.net = None
            shutil.rmtree(self.folder, ignore_errors=True)
        return left

    def _kill_all(self, node: str) -> list[int]:
        """SIGKILL every process in ``node``'s namespace until none is left (at most 10 s); returns those found
        at the first look."""
        found = self.pids(node)
        deadline = time.monotonic() + 10
        while (pids := self.pids(node)) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return found


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
