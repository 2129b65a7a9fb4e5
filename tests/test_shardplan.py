"""The sharded plan and the checks of a sharded answer, without processes."""

from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler

from ferry.common.errors import ConfigError, ProtocolError
from ferry.common.plan import EpochPlan
from ferry.common.shardplan import build_shard_plan, check_sharded, decode_seq, encode_seq, is_sharded
from ferry.consumer.core.sequencers import MapSequencer
from ferry.consumer.core.shards import ShardSequencer


def read_answer(header, plan, seq, epoch):
    """What the run of ``plan`` (its kind's sequencer) makes of a BATCH answering ``seq``."""
    if isinstance(plan, EpochPlan):
        return MapSequencer(1, plan, 0, in_order=True).read_answer(header, seq, epoch)
    return ShardSequencer(1, plan, 0, (0, 0)).read_answer(header, seq, epoch)
from tests.shard_datasets import Shards, SizedShards


@pytest.mark.parametrize("world_size,drop_last", [(1, False), (5, False), (5, True), (12, False)])
def test_shard_order_is_distributed_samplers_over_shard_indices(world_size, drop_last):
    for rank in range(world_size):
        for epoch in range(3):
            plan = build_shard_plan(epoch=epoch, shard_count=12, batch_size=4, shuffle=True, seed=7,
                                    drop_last=drop_last, rank=rank, world_size=world_size)
            sampler = DistributedSampler(range(12), num_replicas=world_size, rank=rank, shuffle=True, seed=7,
                                         drop_last=drop_last)
            sampler.set_epoch(epoch)
            assert list(plan.order) == list(sampler)


def test_len_sums_each_shards_batches_only_with_lengths():
    lengths = [5, 0, 8, 3]
    plan = build_shard_plan(epoch=0, shard_count=4, batch_size=4, shuffle=False, seed=0, drop_last=False, rank=0,
                            world_size=1, lengths=lengths)
    assert len(plan) == 2 + 0 + 2 + 1
    dropped = build_shard_plan(epoch=0, shard_count=4, batch_size=4, shuffle=False, seed=0, drop_last=True, rank=0,
                               world_size=1, lengths=lengths)
    assert len(dropped) == 1 + 0 + 2 + 0
    unknown = build_shard_plan(epoch=0, shard_count=4, batch_size=4, shuffle=False, seed=0, drop_last=False,
                               rank=0, world_size=1)
    with pytest.raises(TypeError, match="shard_len"):
        len(unknown)


def test_seq_encoding_and_task_fields():
    assert decode_seq(encode_seq(7, 123)) == (7, 123)
    plan = build_shard_plan(epoch=0, shard_count=3, batch_size=6, shuffle=False, seed=0, drop_last=True, rank=0,
                            world_size=1)
    assert plan.batch(encode_seq(2, 5)) == [2]
    assert plan.task_fields(encode_seq(2, 5)) == {"shard": [5, 6, 1, 0]}
    assert ShardSequencer(1, plan, 0, (0, 0)).task_fields(encode_seq(2, 5)) == {"shard": [5, 6, 1, 0]}
    assert MapSequencer(1, EpochPlan.from_indices(0, [0, 1], 2, False), 0, in_order=True).task_fields(0) == {}


def test_contract_checks_name_both_methods():
    assert is_sharded(Shards()) and is_sharded(SizedShards())

    class OnlyIter:
        def __iter__(self):
            return iter(())

        def shards(self):
            return []

    with pytest.raises(ConfigError, match=r"without iter_shard.*shards\(\) -> list\[str\] and iter_shard\(name\)"):
        check_sharded(OnlyIter())


def _header(**fields):
    base = {"epoch": 0, "seq": encode_seq(1, 2), "tree": {"t": 1}, "errors": [], "count": 3, "last": True}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def test_a_sharded_answer_is_checked_against_its_run():
    plan = build_shard_plan(epoch=0, shard_count=3, batch_size=4, shuffle=False, seed=0, drop_last=False, rank=0,
                            world_size=1)
    seq = encode_seq(1, 2)
    answer = read_answer(_header(), plan, seq, 0)
    assert answer.last and not answer.empty and answer.indices == [1, 1, 1]
    empty = read_answer(_header(tree=None, count=0), plan, seq, 0)
    assert empty.empty and empty.indices == []
    for bad in (_header(count=5), _header(count=0), _header(last=...), _header(count=..., last=...)):
        with pytest.raises(ProtocolError):
            read_answer(bad, plan, seq, 0)
    with pytest.raises(ProtocolError):
        read_answer(_header(tree=None, count=0, seq=encode_seq(1, 3)), plan, seq, 0)
    map_plan = EpochPlan.from_indices(0, [4, 5, 6], 3, False)
    with pytest.raises(ProtocolError):  # a sharded answer to a map-style task
        read_answer(_header(seq=0), map_plan, 0, 0)
    assert read_answer(_header(seq=0, count=..., last=...), map_plan, 0, 0).indices == [4, 5, 6]
