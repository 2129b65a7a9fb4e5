"""The epoch plan equals DistributedSampler + BatchSampler, batch for batch."""

import dataclasses
import itertools

import pytest
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from ferry.common.errors import ConfigError
from ferry.common.plan import EpochPlan, build_plan, plan_length


# (12, 3, 2) and (12, 3, 5): a length divisible by W=3, one with B dividing the share, one not
@pytest.mark.parametrize("n, world, batch", [(10, 1, 3), (10, 3, 4), (7, 2, 3), (1, 2, 1), (33, 4, 5), (0, 1, 2),
                                             (12, 3, 2), (12, 3, 5)])
@pytest.mark.parametrize("drop_last, shuffle", list(itertools.product([False, True], [False, True])))
def test_plan_matches_distributed_sampler(n, world, batch, drop_last, shuffle):
    for rank, epoch in itertools.product(range(world), [0, 3]):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=11,
                                     drop_last=drop_last)
        sampler.set_epoch(epoch)
        expected = list(BatchSampler(sampler, batch, drop_last)) if n else []
        plan = build_plan(epoch=epoch, dataset_len=n, batch_size=batch, shuffle=shuffle, seed=11,
                          drop_last=drop_last, rank=rank, world_size=world)
        assert [plan.batch(s) for s in range(len(plan))] == expected
        assert len(plan) == plan_length(n, world_size=world, batch_size=batch, drop_last=drop_last)


def test_user_batch_sampler_is_used_as_given():
    batches = [[5, 1], [0], [9, 9, 2]]
    plan = build_plan(epoch=0, dataset_len=None, batch_size=None, shuffle=False, seed=0, drop_last=False, rank=0,
                      world_size=1, batch_sampler=batches)
    assert [plan.batch(s) for s in range(len(plan))] == batches


def test_user_sampler_is_batched_and_gets_set_epoch():
    class Recording(SequentialSampler):
        epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    sampler = Recording(range(7))
    plan = build_plan(epoch=4, dataset_len=None, batch_size=3, shuffle=False, seed=0, drop_last=True, rank=0,
                      world_size=1, sampler=sampler)
    assert [plan.batch(s) for s in range(len(plan))] == [[0, 1, 2], [3, 4, 5]]
    assert Recording.epochs == [4]


def test_an_empty_batch_from_a_batch_sampler_is_refused():
    with pytest.raises(ConfigError, match="empty batch"):
        build_plan(epoch=0, dataset_len=None, batch_size=None, shuffle=False, seed=0, drop_last=False, rank=0,
                   world_size=1, batch_sampler=[[1, 2], []])


def test_the_default_plan_needs_the_dataset_length():
    with pytest.raises(ConfigError, match="length is not known"):
        build_plan(epoch=0, dataset_len=None, batch_size=2, shuffle=False, seed=0, drop_last=False, rank=0,
                   world_size=1)


def test_a_plan_cannot_be_changed_once_built():
    plan = EpochPlan.from_indices(2, [4, 5, 6], batch_size=2, drop_last=False)
    assert plan.epoch == 2 and [plan.batch(s) for s in range(len(plan))] == [[4, 5], [6]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epoch = 3


def test_a_batch_samplers_own_sampler_gets_set_epoch_too():
    class Recording(SequentialSampler):
        epochs: list = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    batch_sampler = BatchSampler(Recording(range(5)), 2, False)
    plan = build_plan(epoch=6, dataset_len=None, batch_size=None, shuffle=False, seed=0, drop_last=False, rank=0,
                      world_size=1, batch_sampler=batch_sampler)
    assert [plan.batch(s) for s in range(len(plan))] == [[0, 1], [2, 3], [4]]
    assert Recording.epochs == [6]


def test_a_generators_shuffle_replays_dataloaders_permutations_in_turn_or_by_a_jump():
    import torch
    from torch.utils.data import DataLoader

    from ferry.common.plan import GeneratorOrder

    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()  # a copy: drawing from the generator below changes nothing here
    order = GeneratorOrder(state)
    loader = DataLoader(range(9), batch_size=None, shuffle=True, generator=generator)
    epochs = [[int(i) for i in loader] for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3 and all(sorted(e) == list(range(9)) for e in epochs)
    assert [order.permutation(e, 9).tolist() for e in range(3)] == epochs
    jumped = GeneratorOrder(state)
    assert jumped.permutation(2, 9).tolist() == epochs[2] and jumped.permutation(0, 9).tolist() == epochs[0]


def test_an_unbatched_plan_makes_each_item_a_task_of_indices_or_of_lists_never_both():
    plan = EpochPlan.unbatched_items(1, [4, 0, 7])
    assert [plan.batch(s) for s in range(len(plan))] == [[4], [0], [7]] and (plan.epoch, plan.unbatched) == (1, "index")
    lists = EpochPlan.unbatched_items(0, [[1, 2], (3,), [5, 6, 7]])
    assert [lists.batch(s) for s in range(len(lists))] == [[1, 2], [3], [5, 6, 7]] and lists.unbatched == "list"
    assert len(EpochPlan.unbatched_items(0, [])) == 0
    with pytest.raises(ConfigError, match="indices or lists of indices, not both"):
        EpochPlan.unbatched_items(0, [1, [2, 3]])
    with pytest.raises(ConfigError, match="empty list of indices"):
        EpochPlan.unbatched_items(0, [[1], []])
