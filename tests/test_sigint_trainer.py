"""SIGINT belongs to the trainer (issue 30, point 2). A Ctrl-C in a terminal reaches the trainer's whole process group;
a trainer that traps it to finish its epoch and checkpoint must get that epoch, as with DataLoader's workers. Local
producers ignore it (a producer started by spec is also in a session of its own); they stop when the loader closes.
Real processes: the trainer in a session of its own, the signal sent to its process group as a terminal sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, producer_env, wait_for
from tests.sigint_trainer import BATCHES


@pytest.mark.parametrize("kind", ["object", "spec"])
def test_a_trainer_that_traps_sigint_finishes_its_epoch(kind, tmp_path):
    out = tmp_path / "trainer.out"
    with open(out, "w") as sink:
        trainer = subprocess.Popen([sys.executable, "-m", "tests.sigint_trainer", kind], cwd=REPO, env=producer_env(),
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for(lambda: "READY" in out.read_text(), 60, "the trainer's first batches")
        os.killpg(trainer.pid, signal.SIGINT)  # what the terminal's Ctrl-C does
        code = trainer.wait(60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait(10)
    text = out.read_text()
    assert code == 0, text
    assert f"CHECKPOINT {BATCHES} 1" in text, text
    assert "ProducerDiedError" not in text and "died" not in text, text


def test_a_producer_stopped_from_outside_is_named_as_such_not_as_a_spawn_mistake():
    from ferry.consumer.local.children import Child, describe_exit

    assert "from outside this loader" in describe_exit(0)
    assert "from outside this loader" in describe_exit(-signal.SIGTERM)
    assert describe_exit(1) == "exit code 1" and describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    child = Child(0, handle=None, stderr_fd=-1, sentinel=None, own_sentinel=False, capture=None)
    child.exit_code = 0
    assert child.stopped_from_outside()
    child.exit_code = 1
    assert not child.stopped_from_outside()
