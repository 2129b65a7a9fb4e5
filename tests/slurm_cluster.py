"""A real Slurm cluster on this machine, for tests/test_slurm.py (root only).

munged, slurmctld and one slurmd per node, each daemon a real process; the controller (``ctl``, also where the
tests run sbatch, as on a login node) and every node are network namespaces on one bridge (tests/netns.Network),
each with its own hostname (``unshare --uts``), address and /etc/hosts naming the others (``unshare --mount``
with a bind mount, which keeps /sys as it is: ``ip netns exec`` remounts it, and slurmd then finds no cgroup
filesystem). Everything lives in one folder: the munge key and socket, slurm.conf (clients get it through
SLURM_CONF; /etc/slurm is never touched), state, spool and logs. ``close()`` stops the daemons, kills whatever
is left in the namespaces (job steps outlive a stopped slurmd), removes the namespaces and the state.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .helpers import wait_for
from .netns import cannot_run, make_network

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "nsenter", "unshare")
CONTROLLER = "ctl"


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class SlurmCluster:
    """Start with ``start()``; ``close()`` always (it undoes whatever part of the start happened)."""

    def __init__(self, folder: Path, nodes: list[str], cpus: int = 2) -> None:
        self.folder, self.nodes, self.cpus = folder, nodes, cpus
        self.conf = folder / "slurm.conf"
        self.net = None
        self.daemons: dict[str, subprocess.Popen] = {}

    # --- start -----------------------------------------------------------------------------------------
    def start(self) -> None:
        if os.geteuid() != 0:
            cannot_run("a Slurm cluster of network namespaces needs root")
        missing = missing_tools()
        if missing:
            cannot_run(f"no {', '.join(missing)} (apt-get install slurm-wlm munge; .ci/run installs them)")
        self.net = make_network([CONTROLLER, *self.nodes])
        for sub in ("munge", "state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text(self._slurm_conf())
        self._start(CONTROLLER, ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._start(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        wait_for(self._all_idle, 60, f"nodes {', '.join(self.nodes)} idle in sinfo", interval=0.2)

    def _start_munge(self) -> None:
        munge = self.folder / "munge"
        munge.chmod(0o711)  # munged wants the socket's folder searchable by all
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        with open(self.folder / "log" / "munged.out", "wb") as log:
            self.daemons["munged"] = subprocess.Popen(
                ["munged", "--force", "--foreground", f"--key-file={key}", f"--socket={self.socket}",
                 f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
                 f"--log-file={self.folder / 'log' / 'munged.log'}"], stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.socket.exists() or self._died("munged"), 30, "munged's socket")

    def _slurm_conf(self) -> str:
        f, addr = self.folder, self.net.addr
        lines = [
            "ClusterName=ferrytest", f"SlurmctldHost={CONTROLLER}({addr[CONTROLLER]})",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "SlurmUser=root", "SlurmdUser=root", "MailProg=/bin/true", "MpiDefault=none",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}/%n",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f}/slurmd.%n.pid",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={f / 'log'}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ReturnToService=2", "KillWait=5",
            # heterogeneous jobs are started by the backfill scheduler: run it every second, not every 30
            "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1",
        ]
        lines += [f"NodeName={n} NodeAddr={addr[n]} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN" for n in self.nodes]
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _start(self, host: str, argv: list[str]) -> None:
        """``argv`` in ``host``'s network namespace, with its own hostname and /etc/hosts."""
        ns = self.net.ns[host]
        script = f"mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname {host} && exec \"$@\""
        with open(self.folder / "log" / f"{host}.out", "wb") as log:
            self.daemons[host] = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{ns}", "unshare", "--uts", "--mount", "sh", "-c", script, host,
                 *argv], stdout=log, stderr=subprocess.STDOUT, env=self.env())

    def _died(self, name: str) -> bool:
        code = self.daemons[name].poll()
        if code is not None:
            raise AssertionError(f"{name} exited with {code} while starting:\n{self.logs()}")
        return False

    def _all_idle(self) -> bool:
        for name in self.daemons:
            self._died(name)
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(n) == "idle" for n in self.nodes)

    # --- use -------------------------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **(extra or {}), "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, env: dict[str, str] | None = None, cwd: str | None = None, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command on the controller's host (the login node)."""
        out = subprocess.run(["nsenter", f"--net=/var/run/netns/{self.net.ns[CONTROLLER]}", *argv],
                             env=self.env(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {out.returncode}: {out.stdout}{out.stderr}")
        return out

    def sbatch(self, *argv: str, env: dict[str, str], cwd: str) -> str:
        """Submit; returns the job id."""
        return self.run("sbatch", "--parsable", *argv, env=env, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job``'s fields, one dict per component ([] once the job is forgotten)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.stdout.splitlines() if line]

    def states(self, job_id: str) -> set[str]:
        return {c.get("JobState", "?") for c in self.job(job_id)}

    def hostnames(self, nodelist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", nodelist).stdout.split()

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.net.ns[host]], capture_output=True, text=True, timeout=10)
        return [int(p) for p in out.stdout.split()]

    def logs(self, lines: int = 30) -> str:
        text = []
        for path in sorted((self.folder / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            text.append(f"--- the end of {path.name}\n" + "\n".join(tail))
        return "\n".join(text)

    # --- stop ------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.net is None:
            return
        left: dict[str, list[int]] = {}
        try:
            if CONTROLLER in self.daemons and self.daemons[CONTROLLER].poll() is None:
                try:
                    self.run("scontrol", "shutdown", check=False)  # slurmctld and every slurmd
                except subprocess.TimeoutExpired:
                    pass  # killed below
            if "munged" in self.daemons:
                self.daemons["munged"].terminate()
            for process in self.daemons.values():
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
            # job steps and their tasks outlive slurmd
            left = {host: pids for host in [CONTROLLER, *self.nodes] if (pids := self._kill_all(host))}
        finally:
            self.net.close()
            self.net = None
            for sub in ("state", "spool", "munge"):
                shutil.rmtree(self.folder / sub, ignore_errors=True)
        assert not left, f"processes that SIGKILL did not end within 10 s, by host: {left}"

    def _kill_all(self, host: str) -> list[int]:
        """SIGKILL every process in ``host``'s namespace until none is left (at most 10 s); returns those left."""
        deadline = time.monotonic() + 10
        while (pids := self.pids(host)) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return pids
