"""How one local producer process starts (docs/ARCHITECTURE.md#local-mode), through the producer's one public
entry point, in one of two ways:

* :class:`SpecLauncher`, for a dataset *spec* (a string): ``python -m ferry.producer …`` as a subprocess, with
  ``stderr=PIPE``. Nothing of the training script is re-imported or pickled.
* :class:`ObjectLauncher`, for a dataset *object*: a daemonic ``multiprocessing`` process running
  :func:`ferry.producer.serve` (``fork`` by default on Linux, as DataLoader does). Its stderr is a FIFO in the
  folder that ``serve`` makes its fd 2 as it starts. Daemonic, as DataLoader's workers are: a
  ``multiprocessing`` child that used a loader exits without waiting for them (``multiprocessing`` joins
  only non-daemonic children at exit; producers never start processes of their own, only threads).

Each start is a *generation* of producer ``index``: 0 for the first, one more for each replacement of a
producer that died. The process is seeded from ``(base seed, index, generation)``
(:func:`ferry.common.sampleinfo.producer_seed`) and its error output is captured in
``producer-<index>.stderr`` (generation 0) or ``producer-<index>.<generation>.stderr``. Every producer dies
with the thread that started it (``PR_SET_PDEATHSIG``), so :class:`~ferry.consumer.local.LocalProducers`
calls :meth:`launch` from its own long-lived thread only.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
from typing import Any

from ferry.common.deferred_pickle import DeferredPickle
from ferry.common.errors import ConfigError
from ferry.common.sampleinfo import producer_seed

from ferry.consumer.local.children import Child, open_pidfd

__all__ = ["SpecLauncher", "ObjectLauncher"]


def _forks(ctx: Any) -> bool:
    """Whether ``ctx`` forks; if so, the modules ``serve`` needs are imported first (``preload``), so that a
    forked producer has none to import before its first batch. Its children freeze what they inherit
    themselves (``ProducerConfig.freeze_inherited``): the trainer's collector is left as it is."""
    if ctx.get_start_method() != "fork":
        return False
    from ferry.producer import preload

    preload()
    return True


class _Launcher:
    """What both kinds share: the folder, the producer count, the base seed, the shared-memory slab."""

    def __init__(self, folder: str, count: int, base_seed: int | None, slab: Any) -> None:
        self.folder, self.count, self.base_seed, self.slab = folder, count, base_seed, slab

    def path(self, index: int, generation: int, suffix: str) -> str:
        tag = f"{index}" if generation == 0 else f"{index}.{generation}"
        return os.path.join(self.folder, f"producer-{tag}.{suffix}")

    def capture(self, index: int, generation: int) -> Any:
        # appends only (O_APPEND), read back with pread: the watch thread writes while another thread reads
        return open(self.path(index, generation, "stderr"), "a+b", buffering=0)

    def seed(self, index: int, generation: int) -> int | None:
        return producer_seed(self.base_seed, index, self.count, generation)


class SpecLauncher(_Launcher):
    """``python -m ferry.producer`` subprocesses serving the dataset ``spec`` with ``args``.

    Raises:
        ConfigError: a producer hook (transform, init, collate) that is not a spec: a new interpreter cannot
            receive a callable.
    """

    def __init__(self, folder: str, endpoint: str, count: int, spec: str, args: dict[str, Any], *, threads: int,
                 slots: int, heartbeat: float, liveness: int, hooks: dict[str, Any], base_seed: int | None,
                 slab: Any) -> None:
        super().__init__(folder, count, base_seed, slab)
        for flag, hook in hooks.items():
            if hook is not None and not isinstance(hook, str):
                raise ConfigError(f"with a dataset spec, {_HOOK_NAMES[flag]} must be a spec too "
                                  "('package.module:function'): the producers are new interpreters")
        self._command = [sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset", spec,
                         "--threads", str(threads), "--slots", str(slots), "--heartbeat", str(heartbeat),
                         "--liveness", str(liveness), "--log-level", os.environ.get("FERRY_LOG_LEVEL", "WARNING")]
        for flag, hook in hooks.items():
            if hook:
                self._command += [flag, hook]
        self._args = json.dumps(args)

    def launch(self, index: int, generation: int) -> Child:
        env = dict(os.environ)
        env["FERRY_EXIT_WITH_PARENT"] = "1"
        env["FERRY_DATASET_ARGS"] = self._args
        env["FERRY_WORKER"] = f"{index}/{self.count}"
        if self.slab is not None:
            env["FERRY_SHARED_MEMORY"] = f"{self.slab.token}:{self.slab.path}"
        command = list(self._command)
        seed = self.seed(index, generation)
        if seed is not None:
            command += ["--seed", str(seed)]
        capture = self.capture(index, generation)
        try:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            capture.close()
            raise
        stderr_fd = os.dup(process.stderr.fileno())
        process.stderr.close()
        os.set_blocking(stderr_fd, False)
        return Child(index, process, stderr_fd, open_pidfd(process.pid), True, capture, generation)


_HOOK_NAMES = {"--transform": "producer_transform", "--init": "producer_init", "--collate": "collate_fn"}


class ObjectLauncher(_Launcher):
    """Daemonic ``multiprocessing`` processes (start method ``mp_context``, default ``fork`` on Linux) running
    ``serve`` with ``dataset``; ``config`` is their ProducerConfig, less what each start sets."""

    def __init__(self, folder: str, count: int, dataset: Any, config: Any, *, mp_context: str | None,
                 base_seed: int | None, slab: Any) -> None:
        super().__init__(folder, count, base_seed, slab)
        self._ctx = multiprocessing.get_context(mp_context or ("fork" if sys.platform == "linux" else "spawn"))
        self._dataset = dataset
        self._config = dataclasses.replace(config, freeze_inherited=_forks(self._ctx))

    def launch(self, index: int, generation: int) -> Child:
        """Its stderr is a FIFO in the folder, which ``serve`` opens as its fd 2 first thing
        (``ProducerConfig.stderr_path``). We open the reading end first, so the child's open never waits;
        nothing of ours is redirected, whatever the start method."""
        from ferry.producer import serve

        fifo = self.path(index, generation, "fifo")
        config = dataclasses.replace(self._config, worker_id=index, seed=self.seed(index, generation),
                                     stderr_path=fifo)
        capture = self.capture(index, generation)
        read_fd = -1
        try:
            os.mkfifo(fifo, 0o600)
            read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: polls as not readable
            process = self._ctx.Process(target=serve, args=(config, DeferredPickle(self._dataset)),
                                        name=f"ferry-producer-{index}", daemon=True)
            process.start()
        except BaseException:
            if read_fd >= 0:
                os.close(read_fd)
            capture.close()
            raise
        return Child(index, process, read_fd, process.sentinel, False, capture, generation)
