"""Shared test plumbing: real producer processes, free loopback ports, waits with deadlines, leak checks."""

from __future__ import annotations

import os
import signal
import socket
from contextlib import contextmanager
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it is truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def dealer(ctx: Any, endpoint: str) -> Any:
    """A raw DEALER connected to ``endpoint``: a hand-made peer that speaks the protocol itself."""
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


class HandMadeConsumer:
    """A raw ROUTER speaking the protocol on a free loopback port, and the real producer ``start`` connects to it
    (``python -m ferry.producer``, a :class:`ProducerProcess`). ``close`` stops both."""

    def __init__(self) -> None:
        import zmq

        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.peer = b""
        self.producer: ProducerProcess | None = None

    def start(self, dataset: str, args: dict[str, Any], **kwargs: Any) -> "ProducerProcess":
        self.producer = ProducerProcess(self.endpoint, dataset, args, **kwargs)
        return self.producer

    def next_message(self, kind: str, timeout: float = 30.0) -> tuple[dict, list[bytes]]:
        """The next message of type ``kind`` from the producer (others skipped): its header and data frames."""
        from ferry.common import protocol

        found: list = []

        def arrived() -> bool:
            while self.sock.poll(0):
                frames = self.sock.recv_multipart()
                header = protocol.parse_header(frames[1])
                if header["type"] == kind:
                    self.peer = frames[0]
                    found.append((header, frames[2:]))
                    return True
            return False

        log = self.producer.output()[-2000:] if self.producer is not None else ""
        wait_for(arrived, timeout, f"a {kind} from the producer (its log: {log})")
        return found[0]

    def send(self, kind: str, **fields: Any) -> None:
        from ferry.common import protocol

        self.sock.send_multipart([self.peer, protocol.pack(kind, **fields)])

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self.sock.close(0)
        self.ctx.term()


def welcome_fields(**given: Any) -> dict[str, Any]:
    """What a hand-made consumer's WELCOME must say besides session, heartbeat and nonce (common/protocol.py's
    SCHEMAS): a loader's defaults, overridden by ``given``."""
    from ferry.common.constants import DEFAULT_FRAME_BYTES, DEFAULT_MAX_BATCH_BYTES

    return {"frame_bytes": DEFAULT_FRAME_BYTES, "max_batch_bytes": DEFAULT_MAX_BATCH_BYTES, "codecs": [], **given}


def next_message(sock: Any, kind: str, timeout: float = 10.0) -> tuple[dict, list]:
    """The next message of type ``kind`` a hand-made peer receives, as ``(header, data frames)``; PINGs (and any
    other type) before it are skipped: a consumer pings every heartbeat, so one may come first."""
    from ferry.common import protocol

    found: list = []

    def arrived() -> bool:
        while sock.poll(0):
            frames = sock.recv_multipart()
            header = protocol.parse_header(frames[0])
            if header["type"] == kind:
                found.append((header, frames[1:]))
                return True
        return False

    wait_for(lambda: arrived() or (sock.poll(50) and False), timeout, f"a {kind}")
    return found[0]


def hello(name: str, *, slots: int, length: int, fingerprint: str) -> bytes:
    """The HELLO of a hand-made producer ``name`` serving a dataset of ``length`` samples."""
    from ferry.common import protocol

    return protocol.pack(protocol.HELLO, producer=name, nonce=1, host="h", pid=1, slots=slots,
                         dataset={"spec": "x", "len": length, "fingerprint": fingerprint})


def producer_env() -> dict[str, str]:
    """The environment of a test's child processes: the repository on PYTHONPATH so that they can import
    the tests' own datasets (``tests.datasets:…``), as a user puts their own package there. Ferry itself
    comes from its installation."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ProducerProcess:
    """``python -m ferry.producer`` as a real child process; stderr is kept for assertions."""

    def __init__(self, endpoints: str | Iterable[str], dataset: str, args: dict[str, Any] | None = None, *,
                 threads: int | None = 2, slots: int = 2, heartbeat: float = 0.2, extra: Iterable[str] = (),
                 netns: str | None = None, prefix: Iterable[str] = (), env: dict[str, str] | None = None) -> None:
        """``prefix``: a command that runs the producer's (its arguments follow it); ``env``: more variables;
        ``threads`` None: no ``--threads`` (the producer's default)."""
        endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        command = [sys.executable, "-m", "ferry.producer", "--dataset", dataset,
                   *(["--threads", str(threads)] if threads is not None else []),
                   "--slots", str(slots), "--heartbeat", str(heartbeat), *extra]
        for endpoint in endpoints:
            command += ["--connect", endpoint]
        for key, value in (args or {}).items():
            import json

            command += ["--dataset-arg", f"{key}={json.dumps(value)}"]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        command = [*prefix, *command]
        self.log_path = f"/tmp/ferry-test-producer-{os.getpid()}-{id(self)}.log"
        self._log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(command, env={**producer_env(), **(env or {})}, stdin=subprocess.DEVNULL,
                                     stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=REPO)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()
        try:
            os.unlink(self.log_path)
        except FileNotFoundError:
            pass


def assert_tree_equal(got: Any, expected: Any, where: str = "batch") -> None:
    """Equal values, dtypes, shapes and structure (list vs tuple vs dict)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: got {type(got).__name__}, expected a tensor"
        assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != {expected.dtype}"
        assert got.shape == expected.shape, f"{where}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
        assert torch.equal(got, expected), f"{where}: values differ"
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
        for key in expected:
            assert_tree_equal(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected), f"{where}: {type(got).__name__} != {type(expected).__name__}"
        assert len(got) == len(expected), f"{where}: length {len(got)} != {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_tree_equal(g, e, f"{where}[{i}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def reference_batches(dataset: Any, *, batch_size: int, drop_last: bool, world_size: int, rank: int,
                      shuffle: bool, seed: int, epoch: int) -> list[Any]:
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, sampler=sampler))


def assert_epoch_matches(loader: Any, dataset: Any, *, epoch: int, batch_size: int, seed: int,
                         each: Callable[[int], Any] | None = None) -> int:
    """Run one epoch of ``loader`` holding one batch at a time, as training does, and check each batch against
    DataLoader's for the same shuffled ``epoch``; ``each(seq)`` is called after every batch checked. Returns the
    batch count. No batch outlives the call, so a caller can check afterwards that every shared-memory slot came
    back."""
    expected = reference_batches(dataset, batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=seed, epoch=epoch)
    count = 0
    for seq, batch in enumerate(loader):
        assert_tree_equal(batch, expected[seq], f"epoch {epoch} batch {seq}")
        count += 1
        if each is not None:
            each(seq)
    assert count == len(expected), f"epoch {epoch}: {count} batches, DataLoader has {len(expected)}"
    return count


# --- leak checks ------------------------------------------------------------------------------------
def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def child_pids() -> set[int]:
    pids = set()
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[1] == me:
                    pids.add(int(entry))
            except (OSError, IndexError):
                pass
    return pids


def warm_zero_copy() -> None:
    """pyzmq's garbage-collector thread and its socket, which a process makes at its first zero-copy send and keeps
    for its life: made here (once per process), before a LeakCheck snapshot of a test that runs a producer in this
    process, so that they do not read as its leaks."""
    from zmq.utils.garbage import gc

    if not gc.is_alive():
        gc.start()
    gc._push_socket  # noqa: B018 (made on first use)


class LeakCheck:
    """Snapshot of threads, fds and child processes; ``assert_clean`` waits (bounded) for them to return."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.fds = open_fds()
        self.children = child_pids()

    def assert_clean(self, timeout: float = 10.0) -> None:
        def leftovers() -> tuple[set, set, set]:
            threads = {t for t in threading.enumerate() if t not in self.threads and t.is_alive()}
            return threads, open_fds() - self.fds, child_pids() - self.children

        deadline = time.monotonic() + timeout
        while True:
            threads, fds, children = leftovers()
            if not (threads or fds or children):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"leaked threads {[t.name for t in threads]}, fds {[(fd, fd_target(fd)) for fd in fds]}, "
                    f"child processes {sorted(children)}"
                )
            time.sleep(0.05)


# --- private internals of the loader, each read in ONE place ----------------------------------------
# Tests that must see
# state that stats() does not show read it only through these accessors, so that a refactor has a single
# place to fix. Prefer loader.stats() wherever it is enough.
def producer_pids(loader: Any) -> dict[str, int]:
    """Live producers' pids by name (public: the ``host:pid`` names of ``stats()["per_producer"]``)."""
    return {name: int(name.rsplit(":", 1)[1]) for name in loader.stats()["per_producer"]}


def lost_slots(loader: Any) -> list[tuple[int, int]]:
    """``(offset, nbytes)`` of the slab slots given up with lost producers whose process may still write.
    PRIVATE: a list of ``(slot, pid)``: the core's SlotLedger, ``IoThread._core.slots._lost``."""
    return [tuple(slot) for slot, _pid in list(loader._io._core.slots._lost)]


def slab_base_address(loader: Any) -> int:
    """Address at which this process maps the local producers' shared-memory slab.
    PRIVATE: ``LocalProducers.slab._mapping``."""
    return loader._local.slab._mapping.__array_interface__["data"][0]


def slab_mapped(pid: int | None = None) -> int:
    """How many mappings of a ``ferry-slab`` memfd the process ``pid`` (default: this one) holds."""
    with open(f"/proc/{pid or os.getpid()}/maps") as f:
        return sum(1 for line in f if "memfd:ferry-slab" in line)


class FullLeakCheck(LeakCheck):
    """LeakCheck plus the shared-memory slab: no ``memfd:ferry-slab`` mapping may outlive the test's batches."""

    def __init__(self) -> None:
        super().__init__()
        self.slab_mappings = slab_mapped()

    def assert_clean(self, timeout: float = 10.0) -> None:
        super().assert_clean(timeout)
        import gc

        gc.collect()
        wait_for(lambda: slab_mapped() <= self.slab_mappings, timeout,
                 f"the slab's mappings to go (still {slab_mapped()}, {self.slab_mappings} before)")


def producer_buffer_pool(producer: Any) -> Any:
    """The BufferPool of an in-process ``ferry.producer.io.service.Producer``. PRIVATE: ``Producer._sharing.datasets.buffers``
    (shared by the batchers of every dataset it serves)."""
    return producer._sharing.datasets.buffers


def pooled_buffer_ids(pool: Any) -> set[int]:
    """ids of the buffers a producer's BufferPool owns. PRIVATE: ``BufferPool._owned``."""
    return set(pool._owned)


def cuda_pinned_pool(loader: Any) -> Any:
    """The PinnedPool of a loader staging to CUDA with pinned memory. PRIVATE: ``RemoteLoader._staging_stager.pool``
    (a ``CudaStager``)."""
    return loader._staging_stager.pool


def cuda_stager(loader: Any) -> Any:
    """The CudaStager of a loader staging to CUDA with pinned memory (its ``registry``, ``direct``,
    ``through_pool``, ``held``). PRIVATE: ``RemoteLoader._staging_stager``."""
    return loader._staging_stager


def local_producer_pids(loader: Any) -> list[int]:
    """pids of the producers a loader started itself, live or not. PRIVATE: ``RemoteLoader._local.pids``."""
    return list(loader._local.pids)


def describe_local_producers(loader: Any) -> str:
    """What a local-mode loader's producers are doing, for a failing wait's message: each pid's state and, where
    ``py-spy`` is installed, its threads' Python stacks; then the tail of each producer's captured stderr."""
    import glob
    import shutil

    parts = []
    for pid in local_producer_pids(loader):
        try:
            with open(f"/proc/{pid}/status") as status:
                state = next((line.strip() for line in status if line.startswith("State:")), "State: ?")
        except OSError:
            state = "gone"
        parts.append(f"--- producer pid {pid}: {state}")
        if state != "gone" and shutil.which("py-spy"):
            try:
                dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True,
                                      timeout=20)
                parts.append(dump.stdout + dump.stderr)
            except subprocess.TimeoutExpired:
                parts.append("(py-spy dump timed out)")
    for path in sorted(glob.glob(os.path.join(local_folder(loader), "producer-*.stderr"))):
        with open(path, "rb") as capture:
            parts.append(f"--- {os.path.basename(path)}:\n" + capture.read()[-3000:].decode(errors="replace"))
    return "\n".join(parts)


def scale_local_producers(loader: Any, count: int) -> None:
    """Ask a ``local_producers="auto"`` loader for ``count`` producers now, as its autoscaler does, and keep its
    autoscaler from deciding anything from then on (a test's loop runs at no realistic step). PRIVATE:
    ``RemoteLoader._local.scale_to`` and ``RemoteLoader._observer._on_demand``."""
    loader._observer._on_demand = None
    loader._local.scale_to(count)


def local_folder(loader: Any) -> str:
    """The private folder of a local-mode loader's ipc socket. PRIVATE: ``RemoteLoader._local.folder``."""
    return loader._local.folder


def host_pool(loader: Any) -> Any:
    """The reused host buffers of a CPU loader's staging. PRIVATE: ``RemoteLoader._staging_stager.host``."""
    return loader._staging_stager.host


def consumer_threads_alive(loader: Any) -> bool:
    """The io thread and the staging thread both run: by their documented names (docs/ARCHITECTURE.md#threads),
    in a process with this one loader."""
    names = [t.name for t in threading.enumerate()]
    return not loader.closed and names.count("ferry-io") == 1 and names.count("ferry-staging") == 1


@contextmanager
def kept_process_state():
    """For a test that runs ``serve`` on a thread of the test process (as an engine's actor does): put back what a
    producer sets for its whole process, so that the tests after it in this process do not inherit it: torch's
    DataLoader worker info (with it, torch's ``default_collate`` makes every batch in shared memory), the generators'
    states, torch's CPU thread count."""
    import random

    import numpy as np
    import torch
    from torch.utils.data._utils import worker

    info, threads = worker._worker_info, torch.get_num_threads()
    states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    try:
        yield
    finally:
        worker._worker_info = info
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
