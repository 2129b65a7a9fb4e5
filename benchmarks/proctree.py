"""What a whole process tree costs: peak memory (PSS) and CPU seconds of a process and everything it starts.

A system under measurement runs as one child process (``Popen``) with a marker variable in its environment
(``BENCH_PROCESS_TREE=<token>``), which every process it starts inherits: its workers, its producers, a Ray
cluster's daemons and workers. :class:`TreeSampler` looks every ``interval`` seconds at every process that is the
child, descends from it, or carries the marker (so a daemon that was re-parented to init still counts), and
keeps:

* the peak of the sum of their PSS (``/proc/PID/smaps_rollup``: each shared page counted once over the processes
  that map it, so the shared-memory slabs, Ray's object store and copy-on-write pages are not counted twice);
* each process's CPU seconds (user + system, ``/proc/PID/stat``) as last seen, summed at the end: what a process
  did after its last sample is missed, so the figure is a floor, short by at most one interval per process.

The sampling itself runs in the benchmark's own process, outside the tree.
"""

from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass

__all__ = ["TreeSampler", "TreeFigures", "MARKER"]

MARKER = "BENCH_PROCESS_TREE"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class TreeFigures:
    peak_pss_mb: float  # [Unit: MB, 1e6 bytes]
    cpu_s: float  # [Unit: second]
    processes: int  # distinct processes seen


class TreeSampler:
    """Samples the tree of ``root`` (a pid) and of the marker ``token`` on a thread of its own until ``stop()``.

    Args:
        interval: seconds between two looks. [Unit: second]
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.token = secrets.token_hex(8)
        self.interval = interval
        self._root: int | None = None
        self._peak_kb = 0
        self._cpu: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-tree-sampler", daemon=True)

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the marker: the child's environment."""
        return {**base, MARKER: self.token}

    def start(self, root: int) -> None:
        self._root = root
        self._thread.start()

    def stop(self) -> TreeFigures:
        self._stop.set()
        self._thread.join()
        return TreeFigures(self._peak_kb * 1024 / 1e6, sum(self._cpu.values()), len(self._cpu))

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                self.sample()  # a last look as it stops
                return

    def sample(self) -> None:
        members = self._members()
        pss = 0
        for pid, start in members:
            pss += _pss_kb(pid)
            cpu = _cpu_s(pid)
            if cpu is not None:
                self._cpu[(pid, start)] = max(cpu, self._cpu.get((pid, start), 0.0))
        self._peak_kb = max(self._peak_kb, pss)

    def _members(self) -> list[tuple[int, int]]:
        parents: dict[int, int] = {}
        starts: dict[int, int] = {}
        marked: set[int] = set()
        needle = f"{MARKER}={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                parents[pid], starts[pid] = int(fields[1]), int(fields[19])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read():
                        marked.add(pid)
            except (OSError, IndexError, ValueError):
                continue
        members = set(marked)
        if self._root is not None:
            for pid in parents:
                p, hops = pid, 0
                while p > 1 and hops < 64:
                    if p == self._root:
                        members.add(pid)
                        break
                    p, hops = parents.get(p, 0), hops + 1
        return [(pid, starts[pid]) for pid in members if pid in starts]


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None
