"""PyTorch's own DataLoader tests, adapted to Ferry (issue 18): how loaders and their workers end: partial
iteration, an error in the loop, a crashed worker, open-file limits, a script that exits mid-epoch, from
pytorch/pytorch ``test/test_dataloader.py``.

Where the original runs its DataLoader in a child process to survive a hang, these run a fresh interpreter
(``python -c``) with a bound on its run time; the one case whose subject is a loader inside a
``multiprocessing`` child keeps that harness. docs/porting.md lists every original case and what became of it.
"""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import TensorDataset

from . import parity_datasets as pd
from .helpers import REPO, local_producer_pids, producer_env, wait_for
from .parity_support import BULK_START_METHODS, local

DATASET = TensorDataset(torch.randn(100, 2, 3, 5, generator=torch.Generator().manual_seed(0)),
                        torch.arange(50).repeat(2))

#: a script's run-time bound: the original's JOIN_TIMEOUT [Unit: second]
JOIN_TIMEOUT = 60

#: how long a process whose loop raised may take to exit: a loader's close takes well under a second (its
#: producers answer SIGTERM at once). A slower exit fails the case, which only delays an expected failure's
#: flip to a pass on a loaded machine, never fakes one. [Unit: second]
EXIT_GRACE = 3

PRELUDE = """\
import gc, multiprocessing, os, resource, sys
import torch
from ferry import RemoteLoader
from tests import parity_datasets as pd
OPTIONS = dict(heartbeat=0.2, log_every=None, timeout=60)
"""


def run_script(body: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c PRELUDE + body`` in a fresh interpreter that can import ``tests``; bounded by JOIN_TIMEOUT."""
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), *args], cwd=REPO,
                          env=producer_env(), capture_output=True, text=True, timeout=JOIN_TIMEOUT)


def gone(pid: int) -> bool:
    """The process ``pid`` has exited (no such process, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def pids_printed(out: str) -> list[int]:
    """The producer pids a script printed on a line ``pids 12 34``."""
    line = next(line for line in out.splitlines() if line.startswith("pids "))
    return [int(p) for p in line.split()[1:]]


# --- ending an iteration early ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_partial_workers(method):
    """torch: TestDataLoader.test_partial_workers: workers exit when the iterator and the loader are dropped
    after 11 of 50 batches, without close()."""
    loader = local(DATASET, method, batch_size=2)
    it = iter(loader)
    for i, _ in enumerate(it):
        if i == 10:
            break
    assert i == 10
    pids = local_producer_pids(loader)
    del it, loader
    gc.collect()
    wait_for(lambda: all(gone(pid) for pid in pids), JOIN_TIMEOUT, f"producers {pids} to exit")


def test_proper_exit_without_a_reference():
    """torch: TestDataLoader.test_proper_exit, hold_iter_reference=False, exit_method=None, in this process:
    the loop over an iterator goes on to the end after the loader and iterator names are dropped at the
    first batch (``for batch in RemoteLoader(...)`` is that case), and the producers exit afterwards."""
    loader = local(pd.ExitDataset(12), "fork", batch_size=1)
    pids = local_producer_pids(loader)
    it = iter(loader)
    count = 0
    for i, _ in enumerate(it):
        if i == 0:
            del it, loader
        count += 1
    assert count == 12
    gc.collect()
    wait_for(lambda: all(gone(pid) for pid in pids), JOIN_TIMEOUT, f"producers {pids} to exit")


PROPER_EXIT = """\
hold, exit_method = sys.argv[1] == "hold", sys.argv[2]
event = multiprocessing.get_context("spawn").Event() if exit_method == "worker_error" else None
loader = RemoteLoader(dataset=pd.ExitDataset(12, event), local_producers=2, batch_size=1, shuffle=False,
                      producer_threads=1, producer_slots=1, **OPTIONS)
print("pids", *loader._local.pids, flush=True)  # PRIVATE, as the original reads it._workers
it = iter(loader)
try:
    for i, _ in enumerate(it):
        if i == 0:
            if not hold:
                del it, loader
            if event is not None:
                event.set()
        if i == 2 and exit_method == "loader_error":
            raise RuntimeError("Loader error")
    if not hold:
        gc.collect()
except BaseException as exc:
    print("raised", *[c.__name__ for c in type(exc).__mro__], flush=True)
    raise
"""

_PROPER_EXIT_CASES = [(hold, how) for hold in ("hold", "drop") for how in ("none", "loader_error", "worker_error")]


def _proper_exit_param(hold: str, how: str):
    marks = [] if (hold, how) == ("hold", "loader_error") else [pytest.mark.slow]
    return pytest.param(hold, how, marks=marks, id=f"{hold}-{how}")


@pytest.mark.parametrize("hold,how", [_proper_exit_param(*case) for case in _PROPER_EXIT_CASES])
def test_proper_exit(hold, how):
    """torch: TestDataLoader.test_proper_exit (map-style, with workers, no pinning; worker_kill is skipped by
    the original itself): a script whose loop ends normally exits 0; one whose loop raises ("Loader error"),
    or whose last worker raises ("Worker error"), exits non-zero with a RuntimeError saying so; in every case
    the script ends and its producers with it. Holding or dropping the reference to the iterator."""
    out = run_script(PROPER_EXIT, hold, how)
    pids = pids_printed(out.stdout)
    wait_for(lambda: all(gone(pid) for pid in pids), JOIN_TIMEOUT, f"producers {pids} to exit")
    if how == "none":
        assert out.returncode == 0, out.stderr[-3000:]
        return
    assert out.returncode != 0
    raised = next(line for line in out.stdout.splitlines() if line.startswith("raised ")).split()[1:]
    assert "RuntimeError" in raised, f"raised {raised}: {out.stderr[-2000:]}"
    assert ("Loader error" if how == "loader_error" else "Worker error") in out.stderr


# --- errors in the loop, crashed workers --------------------------------------------------------------------
@pytest.mark.slow
def test_large_sampler_indices():
    """torch: TestDataLoader.test_large_sampler_indices: 10,000,000 samples in batches of 40960 (large index
    lists in flight), an error raised in the loop at the first batch, the loader left open: the script exits
    with that error, promptly, and so do its producers. Slow: Ferry takes 2.5-5 s for a first batch of 40960
    empty tensors (DataLoader 0.1 s); the exit itself is test_proper_exit[hold-loader_error]'s."""
    out = run_script("pd.raise_in_loop(10_000_000, 40960)")
    assert out.returncode != 0
    assert "RuntimeError: My Error" in out.stderr, out.stderr[-3000:]


def test_large_sampler_indices_in_a_multiprocessing_child():
    """torch: TestDataLoader.test_large_sampler_indices with the original's harness: the loop runs in a
    multiprocessing child (smaller here: 8192 samples in batches of 4096); the child ends, non-zero, once its
    target raised."""
    ctx = multiprocessing.get_context("fork")
    raising = ctx.Event()
    child = ctx.Process(target=pd.raise_in_loop, args=(8192, 4096, raising))
    child.start()
    try:
        assert raising.wait(JOIN_TIMEOUT), "the child's loop never got its first batch"
        child.join(EXIT_GRACE)
        assert not child.is_alive(), f"the child did not exit within {EXIT_GRACE} s of its target raising"
        assert child.exitcode != 0
    finally:
        if child.is_alive():
            child.kill()  # its producers die with it (PR_SET_PDEATHSIG)
            child.join(JOIN_TIMEOUT)


@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_segfault(method):
    """torch: TestDataLoader.test_segfault (skipped on Linux by the original, runnable here): workers that
    segfault make the loop raise a RuntimeError naming a worker's pid and the signal. In Ferry the producers
    that die are replaced, so it is the batch that ends, after max_attempts producers died of it
    (PoisonTaskError, a RuntimeError naming each one, host:pid, and its signal)."""
    with local(pd.Segfaulting(), method, batch_size=2, producer_init=pd.disable_stderr) as loader:
        with pytest.raises(RuntimeError, match=r"producer \S+:\d+: died \(killed by SIGSEGV\)"):
            next(iter(loader))


def test_no_segfault():
    """torch: TestDataLoader.test_no_segfault: a trainer that set 4+ torch threads forks a worker that runs an
    op (gh-54752): no segfault, the first batch arrives."""
    out = run_script("""
        torch.set_num_threads(max(4, torch.get_num_threads()))
        with RemoteLoader(dataset=[1, 2, 3], local_producers=1, mp_context="fork", producer_init=pd.disable_stderr,
                          **OPTIONS) as loader:
            assert next(iter(loader)).tolist() == [1]
        print("OK")
    """)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_conv_after_fork():
    """torch: TestConvAfterFork.test_conv_after_fork: a conv1d in the trainer, then in a forked worker
    (gh-53565)."""
    with local(pd.Conv(), "fork", local_producers=1) as loader:
        shapes = [tuple(x.shape) for x in loader]
    assert shapes == [(1, 1, 1, 23999)]


# --- resources and exit -------------------------------------------------------------------------------------
def test_fd_limit_exceeded():
    """torch: TestDataLoader.test_fd_limit_exceeded (map-style: the original's IterableDataset is incidental to
    it): with 100 open files allowed, a script keeps all 200 batches alive; it runs to the end."""
    out = run_script("""
        kept = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        with RemoteLoader(dataset=pd.RandomTensors(200, (2, 2)), local_producers=1, mp_context="fork",
                          **OPTIONS) as loader:
            for batch in loader:
                batch.max(dim=0)
                kept.append(batch)
        print("OK", len(kept))
    """)
    assert out.returncode == 0 and "OK 200" in out.stdout, out.stderr[-3000:]


def test_early_exit():
    """torch: TestDataLoaderPersistentWorkers.test_early_exit (map-style, as above): a script that breaks out
    of its first epoch (2 workers, pin_memory=True, fork) and ends without closing the loader exits 0."""
    out = run_script("""
        import warnings
        warnings.simplefilter("ignore")  # pin_memory=True without CUDA warns, as DataLoader does
        if __name__ == "__main__":
            loader = RemoteLoader(dataset=pd.RandomTensors(64, (28, 28)), batch_size=16, local_producers=2,
                                  pin_memory=True, mp_context="fork", **OPTIONS)
            for _ in loader:
                break
    """)
    assert out.returncode == 0, out.stderr[-3000:]
