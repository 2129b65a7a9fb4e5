"""A loader leaves the trainer's process as it found it (STYLE.md, rule 12): its stderr is never redirected
while producers start, yet each producer's error output still reaches the trainer's stderr and its death
report; and torch's CPU thread count of threads the trainer starts later is the trainer's, not the staging
thread's. (Signals: tests/test_local_folder.py; the collector: tests/test_fork_start.py; malloc:
tests/test_heap.py.)"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from ferry import ProducerStartupError, RemoteLoader
from tests.datasets import PairDataset


def say_goodbye_and_exit(worker_id: int) -> None:
    """A producer init hook: writes straight to fd 2, as a C library would, then exits with code 3."""
    os.write(2, f"producer {worker_id} says goodbye on fd 2\n".encode())
    os._exit(3)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_producers_stderr_reaches_its_report_and_the_trainers_fd_2_is_never_redirected(method, monkeypatch,
                                                                                         capfd):
    trainer, real_dup2, onto_stderr = os.getpid(), os.dup2, []

    def dup2(fd: int, fd2: int, *args, **kwargs):
        if fd2 == 2 and os.getpid() == trainer:  # a forked producer's own redirection is its business
            onto_stderr.append(fd)
        return real_dup2(fd, fd2, *args, **kwargs)

    monkeypatch.setattr(os, "dup2", dup2)
    with RemoteLoader(dataset=PairDataset(length=8), local_producers=2, batch_size=4, mp_context=method,
                      producer_init=say_goodbye_and_exit, timeout=60) as loader:
        with pytest.raises(ProducerStartupError) as info:
            list(loader)
    text = str(info.value)
    assert text.count("exit code 3") == 2, text
    for worker_id in range(2):  # each producer's own words in its report, not "it wrote nothing"
        assert f"producer {worker_id} says goodbye on fd 2" in text, text
    assert "says goodbye on fd 2" in capfd.readouterr().err  # and shown live, through the watch thread
    assert onto_stderr == []


def _threads_of_a_new_thread() -> int:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join(30)
    return seen[0]


def test_threads_the_trainer_starts_later_keep_its_cpu_thread_count():
    original = torch.get_num_threads()
    torch.set_num_threads(max(2, original))  # one is what the staging thread sets: then nothing could differ
    try:
        before = _threads_of_a_new_thread()
        assert before > 1
        with RemoteLoader(dataset=PairDataset(length=8), local_producers=1, batch_size=4, timeout=60) as loader:
            assert len(list(loader)) == 2  # the staging thread has run: it set its own count to one
            during = _threads_of_a_new_thread()
        assert (during, _threads_of_a_new_thread(), torch.get_num_threads()) == (before, before, before)
    finally:
        torch.set_num_threads(original)
