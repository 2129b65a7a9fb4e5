"""Consumer loss and resume: a killed trainer's successor continues exactly where the state says."""

import json
import subprocess
import sys

import pytest
import torch

from ferry import RemoteLoader
from ferry.common.errors import ConfigError
from tests.datasets import PairDataset

from .helpers import REPO, dealer, hello, producer_env, reference_batches, wait_for


def start_worker(endpoint, state_file, mode):
    return subprocess.Popen([sys.executable, "-m", "tests.resume_worker", endpoint, str(state_file), mode],
                            cwd=REPO, env=producer_env(), stdout=subprocess.PIPE, text=True)


def read_until(proc, marker, limit=10_000):
    lines = []
    for _ in range(limit):
        line = proc.stdout.readline()
        assert line, f"worker ended early after {lines[-3:]}"
        if line.strip() == marker:
            return lines
        lines.append(json.loads(line))
    raise AssertionError(f"no {marker} in {limit} lines")


def test_sigkilled_trainer_resumes_from_its_state_with_the_same_producers(endpoint, spawn, tmp_path):
    args = {"length": 120, "delay": 0.002}
    producers = [spawn(endpoint, "tests.datasets:PidDataset", args) for _ in range(2)]
    pids = {p.pid for p in producers}
    state_file = tmp_path / "state.json"
    save_at = 11
    with start_worker(endpoint, state_file, str(save_at)) as first:
        before = read_until(first, "SAVED")
        first.kill()
        first.wait(10)
    with start_worker(endpoint, state_file, "resume") as second:
        after = read_until(second, "END")
        assert second.wait(30) == 0
    expected = [b[1].tolist() for b in reference_batches(PairDataset(120), batch_size=4, drop_last=False,
                                                          world_size=1, rank=0, shuffle=True, seed=21, epoch=0)]
    assert [line["labels"] for line in before] == expected[:save_at]
    assert [line["labels"] for line in after] == expected[save_at:]
    assert {line["pid"] for line in after} <= pids, "served by producers that were not running before"
    assert all(p.proc.poll() is None for p in producers), "the running producers must not be restarted"


def test_state_dict_is_small_and_round_trips_through_json_and_torch(endpoint, spawn, tmp_path):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 40})
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=3, heartbeat=0.2, timeout=30) as loader:
        loader.set_epoch(2)
        expected = [b[1].tolist() for b in reference_batches(PairDataset(40), batch_size=4, drop_last=False,
                                                              world_size=1, rank=0, shuffle=True, seed=3, epoch=2)]
        it = iter(loader)
        first = [next(it)[1].tolist() for _ in range(3)]
        assert first == expected[:3]
        state = loader.state_dict()
        assert state["epoch"] == 2 and state["batches_delivered"] == 3
        assert len(json.dumps(state)) < 512
        torch.save(state, tmp_path / "s.pt")
        assert torch.load(tmp_path / "s.pt") == json.loads(json.dumps(state)) == state
        rest = [b[1].tolist() for b in it]
        assert rest == expected[3:]  # torch's reference, not this loader's own word
        done = loader.state_dict()
        assert done["epoch"] == 3 and done["batches_delivered"] == 0
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=3, heartbeat=0.2, timeout=30) as loader:
        loader.load_state_dict(state)
        assert [b[1].tolist() for b in loader] == expected[3:]
        assert loader.epoch == 3


def test_set_epoch_of_the_resumed_epoch_keeps_its_position_as_torchvisions_loop_calls_it(endpoint, spawn):
    """torchvision's loop calls set_epoch(epoch) at the top of every epoch, after a resume too: the resumed epoch
    goes on from the saved batch (before, it started over and 9 batches came twice in a trial); another epoch
    is the script's explicit choice and starts from its beginning."""
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 40})
    expected = {e: [b[1].tolist() for b in reference_batches(PairDataset(40), batch_size=4, drop_last=False,
                                                              world_size=1, rank=0, shuffle=True, seed=3, epoch=e)]
                for e in (1, 2)}
    options = dict(endpoint=endpoint, batch_size=4, shuffle=True, seed=3, heartbeat=0.2, timeout=30)
    with RemoteLoader(**options) as loader:
        loader.set_epoch(1)
        it = iter(loader)
        assert [next(it)[1].tolist() for _ in range(4)] == expected[1][:4]
        state = loader.state_dict()
    with RemoteLoader(**options) as loader:
        loader.load_state_dict(state)
        for epoch in (1, 2):  # the script's own loop, from its saved epoch
            loader.set_epoch(epoch)
            assert [b[1].tolist() for b in loader] == (expected[1][4:] if epoch == 1 else expected[2]), epoch
    with RemoteLoader(**options) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(2)  # the script moves on: epoch 2 from its first batch
        assert [b[1].tolist() for b in loader] == expected[2]


def test_a_state_saved_over_a_dataset_of_another_length_is_refused_naming_both(endpoint):
    """Resumed over 210 samples, a state saved over 203 would give another order for the rest of its epoch (a trial
    got 47 samples twice and 47 never): refused when the iteration starts, once the loader knows its length."""
    with RemoteLoader(dataset=PairDataset(203), local_producers=1, batch_size=8, shuffle=True, seed=4,
                      timeout=30, log_every=None) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    assert state["dataset_len"] == 203 and state["batches_delivered"] == 2
    with RemoteLoader(dataset=PairDataset(210), local_producers=1, batch_size=8, shuffle=True, seed=4,
                      timeout=30, log_every=None) as loader:
        loader.load_state_dict(state)
        with pytest.raises(ConfigError, match="saved over a dataset of 203 samples.*this loader's has 210"):
            iter(loader)
        loader.set_epoch(1)  # the way out the message names: the next epoch, afresh
        assert sum(len(b[1]) for b in loader) == 210
    with RemoteLoader(dataset=PairDataset(203), local_producers=1, batch_size=8, shuffle=True, seed=4,
                      timeout=30, log_every=None) as loader:
        loader.load_state_dict(state)  # the same length: resumed
        assert sum(len(b[1]) for b in loader) == 203 - 16


def test_incompatible_state_is_refused(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=4, seed=1, dataset_len=10, timeout=5) as loader:
        with pytest.raises(ConfigError, match="batch_size=8"):
            loader.load_state_dict({"epoch": 0, "batches_delivered": 1, "batch_size": 8, "seed": 1})


# the options whose remainder of the epoch differs if they differ; a state saved with another is refused
BASE = dict(batch_size=4, shuffle=True, seed=1, drop_last=False, rank=0, world_size=2)
OTHER = {"seed": 2, "shuffle": False, "drop_last": True, "batch_size": 8, "rank": 1, "world_size": 3}


@pytest.mark.parametrize("option", sorted(OTHER))
def test_a_state_saved_with_another_option_is_refused_naming_it(endpoint, option):
    """The state comes from a real loader's state_dict() with that one option changed, through JSON."""
    with RemoteLoader(endpoint=endpoint, dataset_len=40, timeout=5, log_every=None,
                      **{**BASE, option: OTHER[option]}) as saver:
        saver.set_epoch(3)
        state = json.loads(json.dumps(saver.state_dict()))
    with RemoteLoader(endpoint=endpoint, dataset_len=40, timeout=5, log_every=None, **BASE) as loader:
        loader.load_state_dict(dict(state, **{option: BASE[option]}))  # the control: only that option differed
        assert loader.epoch == 3
        loader.set_epoch(0)
        with pytest.raises(ConfigError) as refused:
            loader.load_state_dict(state)
        assert f"{option}={OTHER[option]!r}" in str(refused.value) and f"has {BASE[option]!r}" in str(refused.value)
        assert "start epoch 4 afresh with set_epoch(4)" in str(refused.value)  # and what to do instead
        if option == "rank":  # a DDP trial saved rank 0's state only, as torchvision's save_on_master does
            assert "each rank saves its own loader.state_dict()" in str(refused.value)
        assert loader.epoch == 0 and loader.state_dict()["epoch"] == 0  # nothing of the refused state was taken


def test_batches_tagged_with_an_old_session_are_dropped(endpoint):
    """A BATCH from a registered producer that names another consumer session is counted as stale."""
    import zmq

    from ferry.common import protocol

    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=10, timeout=5, heartbeat=0.2) as loader:
        ctx = zmq.Context()
        sock = dealer(ctx, endpoint)
        try:
            sock.send(hello("fake", slots=1, length=10, fingerprint="f"))
            assert sock.poll(10_000)
            welcome = protocol.parse_header(sock.recv())
            sock.send(protocol.pack(protocol.BATCH, session=welcome["session"] ^ 1, task=1, epoch=0, seq=0,
                                    tree=None, errors=[]))
            wait_for(lambda: loader.stats()["stale"] == 1, 5, "the old-session batch to be counted")
        finally:
            sock.close()
            ctx.term()
