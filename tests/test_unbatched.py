"""Unbatched mode (``batch_size=None``), as units: the plan (one task per sample, or per list a sampler yields),
what a task carries, and the options DataLoader refuses with it. The loader itself runs in
tests/test_dataloader_parity_surface.py, tests/test_dataloader_parity_collate.py and tests/test_collate_outputs.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ferry import ConfigError, RemoteLoader
from ferry.common.plan import EpochPlan, build_plan
from ferry.consumer.core import sequencer_for

PLAN = dict(dataset_len=5, batch_size=None, shuffle=False, seed=0, drop_last=False, rank=0, world_size=2)


def test_each_index_of_the_default_plan_is_a_task_of_its_own_split_as_distributed_sampler_splits():
    plan = build_plan(epoch=0, **PLAN, unbatched=True)
    assert [plan.batch(s) for s in range(len(plan))] == [[0], [2], [4]] and plan.unbatched == "index"


def test_a_sampler_s_items_are_tasks_as_given_indices_or_lists():
    assert EpochPlan.unbatched_items(0, [3, np.int64(1), torch.tensor(2)]).unbatched == "index"
    lists = EpochPlan.unbatched_items(0, [[4, 1], (0,), torch.tensor([2, 3])])
    assert lists.unbatched == "list" and [lists.batch(s) for s in range(3)] == [[4, 1], [0], [2, 3]]
    with pytest.raises(ConfigError, match="not both"):
        EpochPlan.unbatched_items(0, [1, [2]])
    with pytest.raises(ConfigError, match="empty list"):
        EpochPlan.unbatched_items(0, [[1], []])


def test_a_task_of_an_unbatched_plan_says_so_and_a_batched_one_does_not():
    unbatched = sequencer_for(1, EpochPlan.unbatched_items(0, [[1, 2]]), 0, (0, 0), in_order=True)
    assert unbatched.task_fields(0) == {"unbatched": "list"}
    batched = sequencer_for(1, EpochPlan.from_indices(0, np.arange(4), 2, False), 0, (0, 0), in_order=True)
    assert batched.task_fields(0) == {}


def test_drop_last_is_refused_with_batch_size_none_as_dataloader_refuses_it():
    with pytest.raises(ConfigError, match="mutually exclusive with drop_last"):
        RemoteLoader(endpoint="tcp://127.0.0.1:1", batch_size=None, drop_last=True)
