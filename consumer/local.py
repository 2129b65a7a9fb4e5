"""Local mode (DESIGN §8): producer processes that a RemoteLoader starts, owns and stops.

They connect over ``ipc://`` to a socket in a private temporary folder. Two ways to start one, both
through the producer's one public entry point:

* a dataset *spec* (a string): ``python -m ferry.producer …`` as a subprocess. Nothing of the training
  script is re-imported or pickled.
* a dataset *object*: a ``multiprocessing`` process running :func:`ferry.producer.serve` with the object
  (``fork`` by default on Linux, as DataLoader does; pass ``mp_context="spawn"`` for objects that must
  not be forked). The object travels by pickle between our own processes, never on the wire.

Each producer dies with its parent (``PR_SET_PDEATHSIG``). ``close()`` sends SIGTERM (the producer says
BYE and exits 0), waits, then SIGKILLs stragglers and removes the folder.

With ``shared_memory=(slots, slot_bytes)`` this object also owns the :class:`ferry.common.shm.Slab` that its
producers write batches into (see :mod:`ferry.common.shm`), and closes it last.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from ferry.common import shm
from ferry.common.constants import JOIN_TIMEOUT_S
from ferry.common.errors import ProducerStartupError

log = logging.getLogger("ferry.consumer")


class _Child:
    """One producer process, behind one interface whatever started it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @property
    def pid(self) -> int:
        return self.handle.pid

    def exitcode(self) -> int | None:
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        return self.handle.exitcode

    def signal_stop(self) -> None:
        if self.exitcode() is None:
            self.handle.terminate()

    def kill(self) -> None:
        if self.exitcode() is None:
            self.handle.kill()

    def wait(self, timeout: float) -> bool:
        if isinstance(self.handle, subprocess.Popen):
            try:
                self.handle.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        self.handle.join(timeout)
        return self.handle.exitcode is not None

    def release(self) -> None:
        if not isinstance(self.handle, subprocess.Popen):
            self.handle.close()


class LocalProducers:
    """N producer processes on this machine; see the module docstring."""

    def __init__(self, count: int, dataset: Any, *, dataset_args: dict[str, Any] | None, threads: int, slots: int,
                 heartbeat: float, liveness: int, mp_context: str | None, transform: str | None = None,
                 shared_memory: tuple[int, int] | None = None) -> None:
        self.transform = transform
        self.folder = tempfile.mkdtemp(prefix="ferry-")
        self.endpoint = f"ipc://{self.folder}/consumer.sock"
        self.children: list[_Child] = []
        self.slab: shm.Slab | None = None
        try:
            if shared_memory is not None and shm.available():
                try:
                    self.slab = shm.Slab(*shared_memory)
                except OSError as exc:  # e.g. a seccomp profile without memfd_create: the socket still works
                    log.warning("no shared memory for local producers (%s); batches go over the socket", exc)
            if isinstance(dataset, str):
                for _ in range(count):
                    self.children.append(_Child(self._spawn_cli(dataset, dataset_args or {}, threads, slots,
                                                                heartbeat, liveness)))
            else:
                from ferry.producer import ProducerConfig, serve

                config = ProducerConfig(
                    endpoints=(self.endpoint,), dataset=type(dataset).__qualname__, threads=threads, slots=slots,
                    heartbeat=heartbeat, liveness=liveness, exit_with_parent=True, transform=transform,
                    shared_memory=(self.slab.path, self.slab.token) if self.slab is not None else None,
                )
                ctx = multiprocessing.get_context(mp_context or ("fork" if sys.platform == "linux" else "spawn"))
                for _ in range(count):
                    process = ctx.Process(target=serve, args=(config, dataset), name="ferry-producer", daemon=False)
                    process.start()
                    self.children.append(_Child(process))
        except BaseException:
            self.close()
            raise

    def _spawn_cli(self, spec: str, args: dict[str, Any], threads: int, slots: int, heartbeat: float,
                   liveness: int) -> subprocess.Popen:
        env = dict(os.environ)
        env["FERRY_EXIT_WITH_PARENT"] = "1"
        env["FERRY_DATASET_ARGS"] = json.dumps(args)
        if self.slab is not None:
            env["FERRY_SHARED_MEMORY"] = f"{self.slab.token}:{self.slab.path}"
        command = [sys.executable, "-m", "ferry.producer", "--connect", self.endpoint, "--dataset", spec,
                   "--threads", str(threads), "--slots", str(slots), "--heartbeat", str(heartbeat),
                   "--liveness", str(liveness), "--log-level", os.environ.get("FERRY_LOG_LEVEL", "WARNING")]
        if self.transform:
            command += ["--transform", self.transform]
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def check(self) -> None:
        """Raise ProducerStartupError if every local producer has exited."""
        codes = [c.exitcode() for c in self.children]
        if codes and all(code is not None for code in codes):
            raise ProducerStartupError(
                f"all {len(codes)} local producers exited (exit codes {codes}); see their error output above"
            )

    def close(self) -> None:
        for child in self.children:
            child.signal_stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in self.children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait(JOIN_TIMEOUT_S)
            child.release()
        self.children.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.slab is not None:
            self.slab.close()
