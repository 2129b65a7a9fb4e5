"""Local producers live as long as DataLoader's workers would (issue 18, part 1): a multiprocessing child that
uses a loader exits without ``close()``; a loader built in a thread that then ends keeps its producers; the
last reference to a loader or its iterator dropped (``break``, ``del``) frees them at once, with the garbage
collector off; and none outlives its trainer, SIGKILL included. Real processes; every wait bounded."""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest
import torch.multiprocessing
from torch.utils.data import DataLoader

from ferry import RemoteLoader
from ferry.consumer.local import folder as local_folder

from tests.datasets import PairDataset
from tests.lifecycle_datasets import spawn_entry, train_without_close

from .helpers import REPO, child_pids, local_producer_pids, producer_env, wait_for


def _gone(pid: int) -> bool:
    return local_folder._start_time(pid) is None  # exited (a zombie counts as gone)


def _assert_exit(pids: list[int], timeout: float = 10.0) -> None:
    for pid in pids:
        wait_for(lambda: _gone(pid), timeout, f"producer {pid} to exit")


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- a multiprocessing child ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_with_a_loader_exits_without_close(method):
    ctx = multiprocessing.get_context(method)
    report = ctx.Queue()
    child = ctx.Process(target=train_without_close, args=(report,), name="test-trainer-child")
    child.start()
    pids: list[int] = []
    try:
        pids = report.get(timeout=60)
        child.join(30)
        assert not child.is_alive(), "the child never exited: multiprocessing waits for its producers"
        assert child.exitcode == 0
        _assert_exit(pids)
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
        _kill_all(pids)
        report.close()
        report.join_thread()


def test_a_torch_multiprocessing_spawn_child_exits_without_close():
    """The classic DDP launch: ``torch.multiprocessing.spawn(train, nprocs=…)`` with a loader in ``train``."""
    ctx = torch.multiprocessing.get_context("spawn")
    report = ctx.Queue()
    context = torch.multiprocessing.start_processes(spawn_entry, args=(report,), nprocs=1, join=False,
                                                     start_method="spawn")
    pids: list[int] = []
    try:
        pids = report.get(timeout=60)
        wait_for(lambda: context.join(0.2), 30, "the spawned trainer to exit")
        assert [p.exitcode for p in context.processes] == [0]
        _assert_exit(pids)
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(10)
        _kill_all(pids)
        report.close()
        report.join_thread()


# --- a loader built in a thread -------------------------------------------------------------------------
def test_a_loader_built_in_a_thread_that_ends_keeps_its_producers(caplog):
    built: queue.Queue = queue.Queue()
    thread = threading.Thread(target=lambda: built.put(RemoteLoader(
        dataset=PairDataset(length=40), local_producers=2, batch_size=4, timeout=30)), name="test-builder")
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    loader = built.get(timeout=1)
    with loader:
        pids = local_producer_pids(loader)
        labels = [int(i) for _, y in loader for i in y]
        assert labels == list(range(40))
        assert local_producer_pids(loader) == pids and not any(_gone(pid) for pid in pids)
        assert not [r for r in caplog.records if "died" in r.getMessage() or "killed" in r.getMessage()]


# --- the last reference -----------------------------------------------------------------------------------
@pytest.fixture
def no_gc():
    """The garbage collector off: only reference counts may free a loader."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _loader(**kwargs) -> RemoteLoader:
    return RemoteLoader(dataset=PairDataset(length=64), local_producers=2, batch_size=4, timeout=30, **kwargs)


def test_a_loop_over_a_loader_that_nobody_holds_runs_and_break_frees_its_producers(no_gc):
    before = child_pids()
    seen: list[int] = []
    pids: set[int] = set()

    def train() -> None:
        for _, y in _loader():  # DataLoader's idiom: the loader is a temporary that only the loop holds
            pids.update(child_pids() - before)
            seen.extend(y.tolist())
            if len(seen) >= 8:
                break

    train()
    assert seen == list(range(8))
    assert len(pids) >= 2
    _assert_exit(sorted(pids))


def test_deleting_the_only_iterator_of_an_unnamed_loader_frees_its_producers(no_gc):
    loader = _loader()
    pids = local_producer_pids(loader)
    it = iter(loader)
    del loader  # the iterator alone keeps the producers, as a DataLoader iterator keeps its workers
    _, y = next(it)
    assert y.tolist() == [0, 1, 2, 3]
    assert not any(_gone(pid) for pid in pids)
    del it
    _assert_exit(pids)


def test_break_then_dropping_the_loader_frees_its_producers(no_gc):
    loader = _loader()
    pids = local_producer_pids(loader)
    for _ in loader:
        break
    assert not any(_gone(pid) for pid in pids)  # the loader still holds them: a next epoch may come
    del loader
    _assert_exit(pids)


def test_a_loader_dropped_after_its_sample_error_frees_its_producers_without_the_garbage_collector(no_gc):
    """A notebook cell: a sample raises in __getitem__, the cell catches it and returns without close(). The
    error reached the loop from a frame that held it, and that frame is in its traceback: a cycle through the
    iterator and the loader, freed only by some later collection, possibly on the loader's own io thread,
    whose shutdown then failed to join itself (a trial: 10 loaders' producers left running of 30)."""
    from tests.datasets import FailingDataset

    def cell() -> list[int]:
        loader = RemoteLoader(dataset=FailingDataset(length=40, bad=(13,)), local_producers=2, batch_size=4,
                              timeout=30)
        pids = local_producer_pids(loader)
        alive = weakref.ref(loader)
        try:
            for _ in loader:
                pass
        except ValueError as error:
            assert "corrupt sample 13" in str(error)
        else:
            raise AssertionError("the sample error did not reach the loop")
        del loader
        assert alive() is None, "the loader outlived the cell: kept by a reference cycle"
        return pids

    _assert_exit(cell())


def test_a_loader_s_shutdown_run_by_the_gc_on_its_own_io_thread_completes(endpoint):
    """A collection that frees a loader can run on any thread, the loader's io thread too; its shutdown must not
    try to join that thread (RuntimeError, which left the finalizer dead and the producers running)."""
    loader = RemoteLoader(endpoint=endpoint, batch_size=4, timeout=30)
    io = loader._io  # PRIVATE: the thread the gc happened to run on
    errors: list[BaseException] = []
    ran = threading.Event()

    def on_the_io_thread(now: float) -> list:
        try:
            loader._finalizer()  # PRIVATE: what the gc runs when the last reference goes
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)
        ran.set()
        return []

    io._command(on_the_io_thread)  # PRIVATE
    assert ran.wait(10), "the io thread did not run the command"
    assert errors == []
    wait_for(lambda: not io.alive, 10, "the io thread to end")
    assert io._waker._closed  # PRIVATE: its pipe was closed by the thread itself, as close() would have
    loader.close()  # already shut down: nothing left to do, nothing raised


@pytest.mark.parametrize("how", ["close", "del"])
@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_a_loader_let_go_lets_go_of_the_dataset_without_the_garbage_collector(no_gc, how, mp_context):
    # DataLoader's workers keep the dataset only while they live; a closed or dropped loader must not keep it (a
    # tensor dataset's shared memory, a file handle) until some later collection: a reference cycle between the
    # local producers and their watch thread did, holding the launcher and the dataset with it
    dataset = PairDataset(length=64)
    alive = weakref.ref(dataset)
    loader = RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, timeout=30, mp_context=mp_context)
    assert [y.tolist() for _, y in loader][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    if how == "close":
        loader.close()
    del dataset, loader
    assert alive() is None, "the dataset outlived its loader: kept by a reference cycle"


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_dataloader_itself_lets_go_of_the_dataset_without_the_garbage_collector(no_gc, mp_context):
    # the reference for the test above: torch's DataLoader, on the same dataset, under the same start method
    dataset = PairDataset(length=64)
    alive = weakref.ref(dataset)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=mp_context)
    assert [y.tolist() for _, y in loader][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    del dataset, loader
    assert alive() is None


# --- never outliving the trainer -------------------------------------------------------------------------
THREAD_TRAINER = textwrap.dedent("""
    import threading
    from ferry import RemoteLoader
    from tests.datasets import PairDataset
    box = []
    builder = threading.Thread(target=lambda: box.append(RemoteLoader(
        dataset=PairDataset(length=100000, delay=0.01), local_producers=2, batch_size=4, timeout=60)))
    builder.start()
    builder.join()
    loader = box[0]
    it = iter(loader)
    next(it)
    print("READY", *loader._local.pids, flush=True)
    while True:
        next(it)
""")


START_METHOD_TRAINER = textwrap.dedent("""
    import sys
    from ferry import RemoteLoader
    from tests.datasets import PairDataset
    if __name__ == "__main__":
        loader = RemoteLoader(dataset=PairDataset(length=100000, delay=0.01), local_producers=2, batch_size=4,
                              timeout=60, mp_context=sys.argv[1])
        it = iter(loader)
        next(it)
        print("READY", *loader._local.pids, flush=True)
        while True:
            next(it)
""")


def _sigkill_the_trainer_and_see_its_producers_exit(command: list[str]) -> None:
    """Run ``command`` (a trainer that prints READY and its two producers' pids), SIGKILL it, and wait for them."""
    trainer = subprocess.Popen(command, env=producer_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        line = trainer.stdout.readline()  # bounded: the trainer's own timeout=60 ends it if nothing starts
        assert line.startswith("READY"), line + trainer.stderr.read()
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and not any(_gone(pid) for pid in pids)
        trainer.kill()
        assert trainer.wait(30) == -signal.SIGKILL
        _assert_exit(pids)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
        trainer.stdout.close()
        trainer.stderr.close()
        _kill_all(pids)


# fork and spawn (their parent is the trainer) are also covered by the thread-trainer test below; in -m slow here
@pytest.mark.parametrize("method", [pytest.param("fork", marks=pytest.mark.slow),
                                    pytest.param("spawn", marks=pytest.mark.slow), "forkserver"])
def test_sigkill_of_the_trainer_ends_its_producers_under_every_start_method(method, tmp_path):
    """Under forkserver a producer's parent is the fork server, not the trainer: the parent-death signal never
    came, and the producers (and the fork server they keep alive) ran on after a SIGKILLed trainer."""
    script = tmp_path / "trainer.py"
    script.write_text(START_METHOD_TRAINER)
    _sigkill_the_trainer_and_see_its_producers_exit([sys.executable, str(script), method])


def test_sigkill_of_a_trainer_whose_loader_was_built_in_a_thread_kills_its_producers():
    _sigkill_the_trainer_and_see_its_producers_exit([sys.executable, "-c", THREAD_TRAINER])
