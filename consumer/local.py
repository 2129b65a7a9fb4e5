"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes that a RemoteLoader starts, owns and stops.

They connect over ``ipc://`` to a socket in a private temporary folder (:mod:`ferry.consumer.local_folder`:
removed on close, on SIGTERM and SIGINT, and swept after a SIGKILL). Two ways to start one, both through the
producer's one public entry point:

* a dataset *spec* (a string): ``python -m ferry.producer …`` as a subprocess. Nothing of the training
  script is re-imported or pickled.
* a dataset *object*: a ``multiprocessing`` process running :func:`ferry.producer.serve` with the object
  (``fork`` by default on Linux, as DataLoader does; pass ``mp_context="spawn"`` for objects that must
  not be forked). The object travels by pickle between our own processes, never on the wire.

Each producer dies with its parent (``PR_SET_PDEATHSIG``). Its stderr is a pipe to this process. One
thread, ``ferry-local-watch``, waits on every pipe and every process sentinel (``Process.sentinel``, or a
``pidfd`` for a subprocess) at once: it copies what a producer writes both to this process's stderr (shown
live, as before) and to ``producer-N.stderr`` in the folder, and it sees a death the moment it happens. A
death is logged at WARNING with the exit code or signal and the tail of that output; the io thread
re-issues the dead producer's tasks to the others. When every local producer is dead, :meth:`check` raises
in the training thread: :class:`ProducerStartupError` if none of them ever served, else
:class:`ProducerDiedError`.

Shutdown order (``close``): mark the set as closing (exits are expected from then on, not reported); SIGTERM
every producer (it says BYE and exits 0), wait, SIGKILL stragglers; stop the watch thread (it copies what is
left in the pipes); close the pipes and files; remove the folder; close the slab last.

With ``shared_memory=(slots, slot_bytes)`` this object also owns the :class:`ferry.common.shm.Slab` that its
producers write batches into (see :mod:`ferry.common.shm`), and closes it last.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from ferry.common import shm
from ferry.common.constants import JOIN_TIMEOUT_S
from ferry.common.errors import ConfigError, ProducerDiedError, ProducerStartupError
from ferry.common.waker import Waker

from ferry.consumer import local_folder

log = logging.getLogger("ferry.consumer")

#: The tail of a dead producer's error output that its report quotes.
STDERR_TAIL_LINES = 15
STDERR_TAIL_CHARS = 2000
#: How often the watch thread polls exit codes where the platform gives no sentinel (no pidfd). [Unit: second]
EXIT_POLL_S = 0.1


def describe_exit(code: int) -> str:
    """``exit code 1``, or ``killed by SIGKILL`` for a negative (signal) code."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


_stderr_lock = threading.Lock()  # one redirection of our fd 2 at a time


def _start_with_stderr(process: Any, stderr_fd: int) -> None:
    """Start a multiprocessing ``process`` with ``stderr_fd`` as its fd 2.

    The child inherits fd 2 as it is when it is forked (or spawned: fds 0-2 pass through exec), so ours points
    at the pipe for that moment only. This keeps the child's code the producer's own entry point
    (:func:`ferry.producer.serve`); a wrapper here would make a spawned child import the consumer. Whatever
    another thread writes to stderr in that moment goes through the pipe, and is still shown.
    """
    with _stderr_lock:
        try:
            saved: int | None = os.dup(2)
        except OSError:  # we run with fd 2 closed: close it again afterwards
            saved = None
        try:
            os.dup2(stderr_fd, 2)
            process.start()
        finally:
            if saved is None:
                os.close(2)
            else:
                os.dup2(saved, 2)
                os.close(saved)


class _Child:
    """One producer process, behind one interface whatever started it, with its stderr pipe and capture."""

    def __init__(self, index: int, handle: Any, stderr_fd: int, sentinel: int | None, own_sentinel: bool,
                 capture: Any) -> None:
        self.index = index
        self.handle = handle
        self.stderr_fd = stderr_fd  # the read end of its stderr pipe, non-blocking
        self.sentinel = sentinel  # readable once it has exited; None: poll its exit code
        self._own_sentinel = own_sentinel  # a pidfd of ours (a Process's sentinel belongs to the Process)
        self.capture = capture  # producer-N.stderr, unbuffered
        self.exit_code: int | None = None  # set by the watch thread when it sees the death

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

    def pump(self) -> bool:
        """Copy what the producer wrote to stderr to our stderr and to its capture file. False at EOF."""
        while True:
            try:
                chunk = os.read(self.stderr_fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self.capture.write(chunk)
            _echo(chunk)

    def tail(self) -> str:
        """The last lines it wrote to stderr, indented, or a note that there were none."""
        try:
            fd = self.capture.fileno()
            size = os.fstat(fd).st_size
            start = max(0, size - 4 * STDERR_TAIL_CHARS)
            text = os.pread(fd, size - start, start).decode(errors="replace")
        except (OSError, ValueError):
            text = ""
        text = "\n".join(text.rstrip().splitlines()[-STDERR_TAIL_LINES:])[-STDERR_TAIL_CHARS:]
        if not text:
            return "    (it wrote nothing to stderr)"
        return "\n".join("    " + line for line in text.splitlines())

    def report(self) -> str:
        return f"producer {self.index} (pid {self.pid}): {describe_exit(self.exit_code or 0)}; its last error " \
               f"output:\n{self.tail()}"

    def release(self) -> None:
        for close in (lambda: os.close(self.stderr_fd), self.capture.close):
            try:
                close()
            except OSError:
                pass
        if self._own_sentinel and self.sentinel is not None:
            os.close(self.sentinel)
        if not isinstance(self.handle, subprocess.Popen):
            self.handle.close()


def _echo(chunk: bytes) -> None:
    """Show a producer's output on our stderr, as when it wrote there itself."""
    view = memoryview(chunk)
    while view:
        try:
            view = view[os.write(2, view):]
        except OSError:
            return


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: the watch thread polls the exit code instead
        return None


class LocalProducers:
    """N producer processes on this machine; see the module docstring."""

    def __init__(self, count: int, dataset: Any, *, dataset_args: dict[str, Any] | None, threads: int, slots: int,
                 heartbeat: float, liveness: int, mp_context: str | None, transform: Any = None,
                 shared_memory: tuple[int, int] | None = None, init: Any = None, collate: Any = None,
                 base_seed: int | None = None) -> None:
        # producer-side hooks: callables or 'package.module:fn' specs (a spawned-by-spec producer needs specs)
        self.transform, self.init, self.collate = transform, init, collate
        self.base_seed = base_seed  # producer i seeds its random streams with base_seed + i, as DataLoader's workers
        self.folder = local_folder.create()
        self.endpoint = f"ipc://{self.folder}/consumer.sock"
        self.children: list[_Child] = []
        self.slab: shm.Slab | None = None
        self._lock = threading.Lock()  # guards exit codes and _closing between the watch thread and the others
        self._closing = False
        self._stop = threading.Event()
        self._waker = Waker()
        self._watch = threading.Thread(target=self._watch_loop, name="ferry-local-watch", daemon=True)
        #: called from the watch thread with (pid, why) for each death it sees, so that the io thread loses
        #: that producer at once instead of after the liveness window; set by the pipeline
        self.on_death: Callable[[int, str], None] | None = None
        try:
            if shared_memory is not None and shm.available():
                try:
                    self.slab = shm.Slab(*shared_memory)
                except OSError as exc:  # e.g. a seccomp profile without memfd_create: the socket still works
                    log.warning("no shared memory for local producers (%s); batches go over the socket", exc)
            if isinstance(dataset, str):
                for name, hook in (("producer_transform", transform), ("producer_init", init),
                                   ("collate_fn", collate)):
                    if hook is not None and not isinstance(hook, str):
                        raise ConfigError(f"with a dataset spec, {name} must be a spec too "
                                          "('package.module:function'): the producers are new interpreters")
                for index in range(count):
                    self.children.append(self._spawn_cli(index, count, dataset, dataset_args or {}, threads, slots,
                                                         heartbeat, liveness))
            else:
                from ferry.producer import ProducerConfig

                config = ProducerConfig(
                    endpoints=(self.endpoint,), dataset=type(dataset).__qualname__, threads=threads, slots=slots,
                    heartbeat=heartbeat, liveness=liveness, exit_with_parent=True, transform=transform,
                    shared_memory=(self.slab.path, self.slab.token) if self.slab is not None else None,
                    num_workers=count, init=init, collate=collate,
                )
                ctx = multiprocessing.get_context(mp_context or ("fork" if sys.platform == "linux" else "spawn"))
                for index in range(count):
                    seeded = dataclasses.replace(config, worker_id=index,
                                                 seed=None if base_seed is None else base_seed + index)
                    self.children.append(self._start_process(index, ctx, seeded, dataset))
            self._watch.start()
        except BaseException:
            self.close()
            raise

    def _capture(self, index: int) -> Any:
        # appends only (O_APPEND), read back with pread: the watch thread writes while another thread reads
        return open(os.path.join(self.folder, f"producer-{index}.stderr"), "a+b", buffering=0)

    def _spawn_cli(self, index: int, count: int, spec: str, args: dict[str, Any], threads: int, slots: int,
                   heartbeat: float, liveness: int) -> _Child:
        env = dict(os.environ)
        env["FERRY_EXIT_WITH_PARENT"] = "1"
        env["FERRY_DATASET_ARGS"] = json.dumps(args)
        env["FERRY_WORKER"] = f"{index}/{count}"
        if self.slab is not None:
            env["FERRY_SHARED_MEMORY"] = f"{self.slab.token}:{self.slab.path}"
        command = [sys.executable, "-m", "ferry.producer", "--connect", self.endpoint, "--dataset", spec,
                   "--threads", str(threads), "--slots", str(slots), "--heartbeat", str(heartbeat),
                   "--liveness", str(liveness), "--log-level", os.environ.get("FERRY_LOG_LEVEL", "WARNING")]
        for flag, hook in (("--transform", self.transform), ("--init", self.init), ("--collate", self.collate)):
            if hook:
                command += [flag, hook]
        if self.base_seed is not None:
            command += ["--seed", str(self.base_seed + index)]
        capture = self._capture(index)
        try:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            capture.close()
            raise
        stderr_fd = os.dup(process.stderr.fileno())
        process.stderr.close()
        os.set_blocking(stderr_fd, False)
        pidfd = _pidfd(process.pid)
        return _Child(index, process, stderr_fd, pidfd, True, capture)

    def _start_process(self, index: int, ctx: Any, config: Any, dataset: Any) -> _Child:
        from ferry.producer import serve

        read_fd, write_fd = os.pipe()
        capture = self._capture(index)
        try:
            process = ctx.Process(target=serve, args=(config, dataset), name="ferry-producer", daemon=False)
            _start_with_stderr(process, write_fd)
        except BaseException:
            os.close(read_fd)
            capture.close()
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        return _Child(index, process, read_fd, process.sentinel, False, capture)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    # --- the watch thread ---------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        """Copy every producer's stderr and see each death at once; see the module docstring."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._waker.fileno(), selectors.EVENT_READ, None)
            for child in self.children:
                selector.register(child.stderr_fd, selectors.EVENT_READ, (child, "stderr"))
                if child.sentinel is not None:
                    selector.register(child.sentinel, selectors.EVENT_READ, (child, "exit"))
            polling = any(child.sentinel is None for child in self.children)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=EXIT_POLL_S if polling else 1.0):
                    if key.data is None:
                        self._waker.drain()
                        continue
                    child, what = key.data
                    if what == "exit":
                        selector.unregister(key.fd)  # readable for good; the exit code is read below
                    elif not child.pump():
                        selector.unregister(key.fd)
                self._note_deaths()
        except BaseException:  # a bug: say so; check() still sees deaths through exit codes
            log.exception("ferry local-producer watch thread failed")
        finally:
            for child in self.children:  # what they wrote last, before close() releases the pipes
                child.pump()
            selector.close()

    def _note_deaths(self) -> None:
        dead = []
        with self._lock:
            if self._closing:
                return
            for child in self.children:
                if child.exit_code is None:
                    code = child.exitcode()
                    if code is not None:
                        child.pump()  # all it wrote is in the pipe now: captured before anyone reports it
                        child.exit_code = code
                        dead.append(child)
            live = sum(child.exit_code is None for child in self.children)
        for child in dead:
            if self.on_death is not None:
                self.on_death(child.pid, f"died ({describe_exit(child.exit_code)})")
            what = "its tasks go to the others" if live else "none is left"
            log.warning("ferry: local %s\n%d of %d local producers live, %s", child.report(), live,
                        len(self.children), what)

    # --- called from the training thread ------------------------------------------------------------
    def check(self, *, served: bool = False) -> None:
        """Raise if every local producer has exited.

        Args:
            served: whether any producer has ever joined this loader (then a death is mid-run).

        Raises:
            ProducerStartupError: all exited and none ever served.
            ProducerDiedError: all exited after serving.
        """
        if not self._watch.is_alive():  # not started, or failed: read the exit codes here
            self._note_deaths()
        with self._lock:
            if not self.children or self._closing or any(c.exit_code is None for c in self.children):
                return
            reports = "\n".join(child.report() for child in self.children)
        n = len(self.children)
        who = "the local producer" if n == 1 else f"all {n} local producers"
        if served:
            raise ProducerDiedError(f"{who} died mid-run:\n{reports}")
        raise ProducerStartupError(f"{who} exited before serving:\n{reports}")

    def close(self) -> None:
        with self._lock:
            self._closing = True
        for child in self.children:
            child.signal_stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in self.children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait(JOIN_TIMEOUT_S)
        self._stop.set()
        self._waker.wake()
        if self._watch.is_alive():
            self._watch.join(JOIN_TIMEOUT_S)
        self._waker.close()
        for child in self.children:
            child.release()
        self.children.clear()
        local_folder.remove(self.folder)
        if self.slab is not None:
            self.slab.close()
