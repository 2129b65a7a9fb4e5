"""How one local producer process starts (docs/ARCHITECTURE.md#local-mode), through the producer's one public
entry point, in one of two ways:

* :class:`SpecLauncher`, for a dataset *spec* (a string): ``python -m ferry.producer …`` as a subprocess, with
  the command line of its ``ProducerConfig`` and ``stderr=PIPE``. Nothing of the training script is
  re-imported or pickled.
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
import multiprocessing
import multiprocessing.context
import os
import pickle
import subprocess
import sys
from typing import Any

from ferry.common.constants import LOCAL_DRAIN_TIMEOUT_S, LOCAL_PRODUCER_LOG_LEVEL
from ferry.common.deferred_pickle import HOOKS, DeferredPickle, WithHooks
from ferry.common.errors import ConfigError
from ferry.common.sampleinfo import producer_seed
from ferry.common.settings import shared_values

from ferry.consumer.local.children import Child, open_pidfd
from ferry.consumer.options import LocalOptions

__all__ = ["SpecLauncher", "ObjectLauncher", "producer_config"]

#: The loader's keyword of each local option (a hook's ``init`` is ``producer_init``), as LocalOptions declares it.
_OPTION_OF = {field: keyword for keyword, field in LocalOptions.flat_keywords().items()}


def producer_config(local: Any, transport: Any, dataset: Any, dataset_args: dict[str, Any] | None, *,
                    endpoint: str, slab: Any, num_workers: int) -> Any:
    """The local producers' ProducerConfig: every option it declares with the same setting as the loader's groups
    (threads, slots, heartbeat, liveness, the hooks: common/settings.py), where to connect, the slab (or None),
    ``exit_when_stuck`` as long as the loader's ``task_timeout``, and ``num_workers`` (the most producers there can
    be: ``get_worker_info().num_workers``).

    Raises:
        ConfigError: a producer hook that is not a spec with a dataset spec.
    """
    from ferry.producer import ProducerConfig

    if isinstance(dataset, str):
        for field in ("transform", "init", "collate"):
            hook = getattr(local, field)
            if hook is not None and not isinstance(hook, str):
                raise ConfigError(f"with a dataset spec, {_OPTION_OF[field]} must be a spec too "
                                  "('package.module:function'): the producers are new interpreters")
    return ProducerConfig(
        endpoints=(endpoint,), dataset=dataset if isinstance(dataset, str) else type(dataset).__qualname__,
        dataset_args=dict(dataset_args or {}), exit_with_parent=True, trainer_pid=os.getpid(),
        # one whose loading threads are all held by loads given up on exits, to be replaced (producer/core/stuck.py)
        exit_when_stuck=transport.task_timeout,
        torch_threads=1,  # as DataLoader's workers, whatever OMP_NUM_THREADS the trainer has (torch_threads.py)
        num_workers=num_workers, drain_timeout=LOCAL_DRAIN_TIMEOUT_S,
        shared_memory=(slab.path, slab.token) if slab is not None else None,
        **shared_values(ProducerConfig, local, transport),
    )


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
    """What both kinds share: the folder, the producers' ProducerConfig, the base seed."""

    def __init__(self, folder: str, config: Any, base_seed: int | None) -> None:
        self.folder, self.config, self.base_seed = folder, config, base_seed

    def path(self, index: int, generation: int, suffix: str) -> str:
        tag = f"{index}" if generation == 0 else f"{index}.{generation}"
        return os.path.join(self.folder, f"producer-{tag}.{suffix}")

    def capture(self, index: int, generation: int) -> Any:
        # appends only (O_APPEND), read back with pread: the watch thread writes while another thread reads
        return open(self.path(index, generation, "stderr"), "a+b", buffering=0)

    def configured(self, index: int, generation: int) -> Any:
        """The config of producer ``index``'s ``generation``-th start: its worker id and its own seed."""
        seed = producer_seed(self.base_seed, index, self.config.num_workers, generation)
        return dataclasses.replace(self.config, worker_id=index, seed=seed)


class SpecLauncher(_Launcher):
    """``python -m ferry.producer`` subprocesses, with the command line of their ProducerConfig
    (:func:`ferry.producer.command_line`); of the environment they inherit, the producer's own ``FERRY_*``
    variables are left out, so that only the loader's options configure them."""

    def launch(self, index: int, generation: int) -> Child:
        from ferry.producer import command_line

        log_level = os.environ.get("FERRY_LOG_LEVEL") or LOCAL_PRODUCER_LOG_LEVEL
        argv, env = command_line(self.configured(index, generation), log_level, environ=os.environ)
        capture = self.capture(index, generation)
        try:
            # a session (process group) of its own: the terminal's Ctrl-C is the trainer's, never its producers'
            # (even before the producer ignores SIGINT itself: ferry.producer.ignore_sigint)
            process = subprocess.Popen([sys.executable, "-m", "ferry.producer", *argv], env=env,
                                       stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except BaseException:
            capture.close()
            raise
        stderr_fd = os.dup(process.stderr.fileno())
        process.stderr.close()
        os.set_blocking(stderr_fd, False)
        return Child(index, process, stderr_fd, open_pidfd(process.pid), True, capture, generation)


class ObjectLauncher(_Launcher):
    """Daemonic ``multiprocessing`` processes (``mp_context``: a start method's name or a context object; default
    ``fork`` on Linux) running ``serve`` with ``dataset``."""

    def __init__(self, folder: str, config: Any, dataset: Any, *, mp_context: Any,
                 base_seed: int | None) -> None:
        # a context object as given, or a start method's name (None: fork on Linux, as DataLoader)
        self._ctx = (mp_context if isinstance(mp_context, multiprocessing.context.BaseContext) else
                     multiprocessing.get_context(mp_context or ("fork" if sys.platform == "linux" else "spawn")))
        super().__init__(folder, dataclasses.replace(config, freeze_inherited=_forks(self._ctx)), base_seed)
        self._dataset = dataset

    def launch(self, index: int, generation: int) -> Child:
        """Its stderr is a FIFO in the folder, which ``serve`` opens as its fd 2 first thing
        (``ProducerConfig.stderr_path``). We open the reading end first, so the child's open never waits;
        nothing of ours is redirected, whatever the start method."""
        from ferry.producer import serve_process

        fifo = self.path(index, generation, "fifo")
        config = dataclasses.replace(self.configured(index, generation), stderr_path=fifo)
        # the dataset and its hooks in one pickle (WithHooks); the config carries neither
        payload = DeferredPickle(WithHooks(self._dataset, **{h: getattr(config, h) for h in HOOKS}))
        config = dataclasses.replace(config, **{h: None for h in HOOKS})
        capture = self.capture(index, generation)
        read_fd = -1
        try:
            os.mkfifo(fifo, 0o600)
            read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: polls as not readable
            process = self._ctx.Process(target=serve_process, args=(config, payload),
                                        name=f"ferry-producer-{index}", daemon=True)
            try:
                process.start()
            except (pickle.PicklingError, TypeError, AttributeError) as exc:  # spawn and forkserver pickle them
                culprit = self._unpicklable(config_hooks=payload.load().hooks)
                if culprit is None:
                    raise
                raise ConfigError(f"{culprit} cannot be sent to a {self._ctx.get_start_method()} producer, which "
                                  f"gets it pickled ({type(exc).__name__}: {exc}). Define functions and classes at "
                                  "a module's top level, open files and connections in __getitem__ (or a "
                                  "producer_init), not in __init__; or pass mp_context=\"fork\"") from exc
        except BaseException:
            if read_fd >= 0:
                os.close(read_fd)
            capture.close()
            raise
        return Child(index, process, read_fd, process.sentinel, False, capture, generation)

    def _unpicklable(self, config_hooks: dict[str, Any]) -> str | None:
        """Which of the dataset and the hooks cannot be pickled, as ``option=value``; None if each alone can."""
        from multiprocessing.reduction import ForkingPickler

        parts = {"dataset": self._dataset, **{_OPTION_OF.get(h, h): v for h, v in config_hooks.items()}}
        for option, value in parts.items():
            try:
                ForkingPickler.dumps(value)
            except Exception:  # noqa: BLE001 - any failure names this part
                return f"{option}={value!r}"
        return None
