"""A state saved after a resume resumes exactly again (issue 17).

Three trainers in a row, as a job that is pre-empted twice: the first takes some batches and saves its
state; the second loads it, takes some more (or none) and saves again; the third loads that second state and
runs on. Together they must get DataLoader's epoch exactly: no batch twice, none missing. Each trainer is a
new RemoteLoader on the same endpoint, served by the same real producer processes, and the states go through
JSON as a checkpoint would.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset
from tests.shard_datasets import SizedShards, as_pairs, reference

from .helpers import reference_batches

LENGTH, BATCH, SEED = 40, 4, 7  # 10 batches an epoch


def _loader(endpoint: str, state: dict[str, Any] | None = None) -> RemoteLoader:
    loader = RemoteLoader(endpoint=endpoint, batch_size=BATCH, shuffle=True, seed=SEED, heartbeat=0.2, timeout=30,
                          log_every=None)
    if state is not None:
        loader.load_state_dict(json.loads(json.dumps(state)))  # through a checkpoint file's format
    return loader


def _take(iterator: Any, count: int, read: Callable[[Any], Any]) -> list[Any]:
    return [read(next(iterator)) for _ in range(count)]


def _labels(batch: Any) -> list[int]:
    return batch[1].tolist()


def _expected(epoch: int) -> list[list[int]]:
    return [_labels(b) for b in reference_batches(PairDataset(LENGTH), batch_size=BATCH, drop_last=False,
                                                  world_size=1, rank=0, shuffle=True, seed=SEED, epoch=epoch)]


# when the second trainer saves: after some batches of its resumed run, after iter() but before any batch,
# or before it even called iter()
SECOND_SAVES = {"after 4 batches": 4, "after iter, before any batch": 0, "before iter": None}


@pytest.mark.parametrize("second", sorted(SECOND_SAVES))
def test_a_state_saved_after_a_resume_resumes_exactly_again(endpoint, spawn, second):
    for _ in range(2):
        spawn(endpoint, "tests.datasets:PairDataset", {"length": LENGTH}, threads=1, slots=2)
    with _loader(endpoint) as first:
        head = _take(iter(first), 3, _labels)
        state = first.state_dict()
    with _loader(endpoint, state) as resumed:
        middle = []
        if SECOND_SAVES[second] is not None:
            middle = _take(iter(resumed), SECOND_SAVES[second], _labels)
        again = resumed.state_dict()
    with _loader(endpoint, again) as last:
        tail = [_labels(b) for b in last]
    assert head + middle + tail == _expected(0), f"replayed or skipped batches; second state {again}"
    assert (again["epoch"], again["batches_delivered"]) == (0, 3 + len(middle)), again


def test_a_state_saved_in_the_next_epoch_of_a_resumed_run_resumes_exactly(endpoint, spawn):
    for _ in range(2):
        spawn(endpoint, "tests.datasets:PairDataset", {"length": LENGTH}, threads=1, slots=2)
    with _loader(endpoint) as first:
        head = _take(iter(first), 7, _labels)
        state = first.state_dict()
    with _loader(endpoint, state) as resumed:
        rest = [_labels(b) for b in resumed]  # the resumed epoch to its end ...
        at_boundary = resumed.state_dict()
        next_head = _take(iter(resumed), 2, _labels)  # ... and two batches of the next
        again = resumed.state_dict()
    with _loader(endpoint, again) as last:
        next_tail = [_labels(b) for b in last]
        assert last.epoch == 2
    with _loader(endpoint, at_boundary) as other:  # the state saved exactly at the boundary
        whole_next = [_labels(b) for b in other]
    assert head + rest == _expected(0), "epoch 0: replayed or skipped batches"
    assert next_head + next_tail == _expected(1), "epoch 1: replayed or skipped batches"
    assert whole_next == _expected(1), "the state saved at the epoch's end"
    assert (at_boundary["epoch"], at_boundary["batches_delivered"]) == (1, 0), at_boundary
    assert (again["epoch"], again["batches_delivered"]) == (1, 2), again


@pytest.mark.parametrize("taken", [5, 0])
def test_a_sharded_state_saved_after_a_resume_resumes_exactly_again(endpoint, spawn, taken):
    """The same over shards: the state names the shard position and the batch within it."""
    dataset = SizedShards()
    for _ in range(2):
        spawn(endpoint, "tests.shard_datasets:SizedShards", {}, threads=1, slots=2)
    with _loader(endpoint) as first:
        head = _take(iter(first), 6, as_pairs)
        state = first.state_dict()
    with _loader(endpoint, state) as resumed:
        middle = _take(iter(resumed), taken, as_pairs)
        again = resumed.state_dict()
    with _loader(endpoint, again) as last:
        tail = [as_pairs(b) for b in last]
    assert head + middle + tail == reference(dataset, batch_size=BATCH, seed=SEED), (
        f"replayed or skipped batches; second state {again}")
    assert {"shard_position", "shard_batch"} <= set(again)
