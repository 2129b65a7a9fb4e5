"""A loader leaves the trainer's process as it found it (STYLE.md, rule 12): its stderr is never redirected
while producers start, yet each producer's error output still reaches the trainer's stderr and its death
report. (Signals: tests/test_local_folder.py; the collector: tests/test_fork_start.py; malloc:
tests/test_heap.py.)"""

from __future__ import annotations

import os

import pytest

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
