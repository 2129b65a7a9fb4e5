"""Acceptance 5 (deaths): a local producer's death is seen at once, through its process sentinel, and reported
with its exit code or signal and the tail of its stderr; the error's type fits the moment."""

import logging
import os
import signal
import time

import pytest

from ferry import ProducerDiedError, ProducerStartupError, RemoteLoader
from ferry.consumer.local import producers as local_producers
from ferry.consumer.local.children import describe_exit
from tests.datasets import PairDataset

from .helpers import wait_for

SLOW = {"length": 4000, "shape": [2], "delay": 0.01}  # an epoch far longer than any of these tests


def _slow(kind):
    return ("synthetic", SLOW) if kind == "spec" else (PairDataset(length=4000, shape=(2,), delay=0.01), None)


def _context(kind):
    return "spawn" if kind == "spawn" else None


@pytest.mark.parametrize("kind", ["spec", "object"])
def test_sigkill_of_one_of_two_producers_is_logged_at_once_and_the_run_goes_on(kind, caplog):
    dataset, args = _slow(kind)
    # the default liveness window (5 heartbeats of 1 s) is what the old code waited before noticing
    with RemoteLoader(dataset=dataset, dataset_args=args, local_producers=2, batch_size=4, timeout=30) as loader:
        it = iter(loader)
        next(it)
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "both producers to join")
        victim = loader._local.pids[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()

        def reported():
            return [r for r in caplog.records if r.levelno == logging.WARNING and f"pid {victim}" in r.getMessage()]

        records = wait_for(reported, 2.0, f"a WARNING about producer {victim}")
        assert time.monotonic() - killed < 2.0
        text = records[0].getMessage()
        assert "killed by SIGKILL" in text and "1 of 2 local producers live" in text, text
        for _ in range(5):  # not fatal: the other producer serves on
            next(it)


@pytest.mark.parametrize("kind", ["spec", "object", "spawn"])
def test_sigkill_of_the_last_producer_past_its_respawn_bound_raises_producer_died_error_within_2_s(kind, monkeypatch):
    """A dead producer is replaced (tests/test_respawn.py) within a bound; past it, here at once, the loop learns
    of the death within 2 s."""
    monkeypatch.setattr(local_producers, "RESPAWNS_PER_WINDOW", 0)
    dataset, args = _slow(kind)
    with RemoteLoader(dataset=dataset, dataset_args=args, local_producers=1, batch_size=4, timeout=30,
                      buffer_batches=2, mp_context=_context(kind)) as loader:
        it = iter(loader)
        next(it)
        victim = loader._local.pids[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(ProducerDiedError) as info:
            for _ in range(1000):  # what was buffered comes first; then the loop must learn of the death
                next(it)
        assert time.monotonic() - killed < 2.0
    text = str(info.value)
    assert f"pid {victim}" in text and "killed by SIGKILL" in text and "mid-run" in text, text
    assert "respawned 0 times in the last 60 s, the bound" in text, text
    assert not isinstance(info.value, ProducerStartupError)


def test_a_producer_that_dies_at_start_up_is_a_startup_error_quoting_its_stderr(capfd):
    with RemoteLoader(dataset="no_such_module_for_ferry:Thing", local_producers=2, batch_size=4,
                      timeout=30) as loader:
        started = time.monotonic()
        with pytest.raises(ProducerStartupError) as info:
            iter(loader)
        assert time.monotonic() - started < 20
    text = str(info.value)
    assert "all 2 local producers exited before serving" in text and "exit code" in text, text
    assert text.count("no_such_module_for_ferry") >= 2, text  # each producer's own words, not "see above"
    assert "its error output ends as producer" in text, text  # the same error is quoted once, not per producer
    assert info.value.__context__ is None, repr(info.value.__context__)  # not chained to the loop's queue.Empty
    assert "no_such_module_for_ferry" in capfd.readouterr().err  # and still shown live, as before


class BrokenOnArrival(PairDataset):
    """Fine here; raises when a spawned producer unpickles it (an archive that cannot be reopened there)."""

    def __setstate__(self, state):
        raise RuntimeError("cannot reopen the archive in the producer")


def test_a_spawned_producer_that_dies_at_start_up_is_reported_with_its_traceback(capfd):
    with RemoteLoader(dataset=BrokenOnArrival(length=8), local_producers=1, mp_context="spawn", batch_size=4,
                      timeout=30) as loader:
        it = iter(loader)
        with pytest.raises(ProducerStartupError) as info:
            next(it)
    text = str(info.value)
    assert "exit code 1" in text and "cannot reopen the archive in the producer" in text, text
    assert info.value.__context__ is None, repr(info.value.__context__)  # raised by next(): no queue.Empty chained
    assert "cannot reopen the archive" in capfd.readouterr().err  # shown live too


def test_describe_exit_names_the_signal_or_the_code():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-15).startswith("killed by SIGTERM from outside this loader")  # the loader never kills so
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-200) == "killed by signal 200"


def test_dead_local_producers_are_not_fatal_while_a_remote_producer_serves(endpoint, spawn, caplog):
    dataset, args = _slow("spec")
    with RemoteLoader(endpoint=endpoint, dataset=dataset, dataset_args=args, local_producers=1, batch_size=4,
                      heartbeat=0.2, timeout=30) as loader:
        spawn(endpoint, "synthetic", SLOW, threads=1, slots=2)
        it = iter(loader)
        next(it)
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "the local and the remote producer to join")
        victim = loader._local.pids[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any(f"pid {victim}" in r.getMessage() for r in caplog.records), 2.0, "the death's WARNING")
        for _ in range(40):  # the remote producer carries the run; nothing raises
            next(it)


def test_a_producer_that_wrote_nothing_once_started_points_at_what_it_wrote_while_starting(tmp_path):
    """Under spawn, a script without the __main__ guard fails in each producer while it starts, before its stderr
    is captured: Python's RuntimeError is on the trainer's stderr, and the report says where to look and why."""
    from ferry.consumer.local.children import Child

    with open(tmp_path / "producer-0.stderr", "w+b", buffering=0) as capture:
        tail = Child(0, handle=None, stderr_fd=-1, sentinel=None, own_sentinel=False, capture=capture).tail()
    text = " ".join(tail.split())  # the note is wrapped over lines
    assert "wrote nothing to stderr once started" in text and "this process's stderr, above" in text, tail
    assert 'if __name__ == "__main__":' in tail


def _dead_child(tmp_path, index, pid, code, output):
    from ferry.consumer.local.children import Child

    class Handle:  # what a report reads of the process: its pid
        pass

    handle = Handle()
    handle.pid = pid
    capture = open(tmp_path / f"producer-{index}.stderr", "w+b", buffering=0)
    capture.write(output.encode())
    child = Child(index, handle=handle, stderr_fd=-1, sentinel=None, own_sentinel=False, capture=capture)
    child.exit_code = code
    return child


def test_reports_quote_an_error_output_once_and_name_the_producers_that_ended_the_same_way(tmp_path):
    """Every producer failing on the same missing file: one traceback in the error, not one per producer; a
    different error is quoted in full; the log of each death quotes only its last line."""
    from ferry.consumer.local.children import reports

    same = "Traceback (most recent call last):\n  File \"ds.py\", line 3\nOSError: /data/x.h5 not found\n"
    children = [_dead_child(tmp_path, 0, 100, 1, "Process ferry-producer-0:\n" + same),
                _dead_child(tmp_path, 1, 101, 1, "Process ferry-producer-1:\n" + same),
                _dead_child(tmp_path, 2, 102, 2, "MemoryError: out of memory\n")]
    try:
        text = reports(children)
        assert text.count("Traceback") == 1 and text.count("OSError: /data/x.h5 not found") == 2, text
        assert "producer 1 (pid 101): exit code 1; its error output ends as producer 0's: OSError: /data/x.h5" \
            in text, text
        assert "producer 2 (pid 102): exit code 2; its last error output:\n    MemoryError: out of memory" in text
        assert children[0].brief() == ("producer 0 (pid 100): exit code 1; its last line on stderr: "
                                       "OSError: /data/x.h5 not found")
    finally:
        for child in children:
            child.capture.close()
