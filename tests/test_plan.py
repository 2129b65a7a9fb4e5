"""The epoch plan equals DistributedSampler + BatchSampler, batch for batch."""

import itertools

import pytest
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from ferry.common.plan import build_plan, plan_length


@pytest.mark.parametrize("n, world, batch", [(10, 1, 3), (10, 3, 4), (7, 2, 3), (1, 2, 1), (33, 4, 5), (0, 1, 2)])
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
