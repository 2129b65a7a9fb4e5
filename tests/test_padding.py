"""DistributedSampler's padding and truncation, end to end: three ranks, lengths divisible neither by the
world size nor by the batch size, drop_last on and off, every batch of every rank against torch's
DataLoader(sampler=DistributedSampler(...)). One producer serves the three ranks' consumers in turn, as it
would serve the ranks of one torchrun job."""

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import ProducerProcess, assert_tree_equal, reference_batches

WORLD = 3
BATCH = 4


# 31 = 3*10+1 (pads 2 or truncates 1), 29 = 3*9+2 (pads 1 or truncates 2); neither divides by 4
@pytest.mark.parametrize("length, drop_last, shuffle", [(31, False, True), (31, True, False), (29, False, False),
                                                        (29, True, True)])
def test_three_ranks_pad_and_truncate_as_distributed_sampler(endpoint, length, drop_last, shuffle):
    dataset = PairDataset(length=length)
    producer = ProducerProcess(endpoint, "tests.datasets:PairDataset", {"length": length}, threads=2, slots=2)
    try:
        served = []
        for rank in range(WORLD):
            expected = reference_batches(dataset, batch_size=BATCH, drop_last=drop_last, world_size=WORLD, rank=rank,
                                         shuffle=shuffle, seed=11, epoch=1)
            with RemoteLoader(endpoint=endpoint, batch_size=BATCH, shuffle=shuffle, seed=11, drop_last=drop_last,
                              rank=rank, world_size=WORLD, heartbeat=0.2, timeout=30, log_every=None) as loader:
                loader.set_epoch(1)
                assert len(loader) == len(expected), f"rank {rank}: len {len(loader)} != {len(expected)}"
                got = list(loader)
            assert len(got) == len(expected), f"rank {rank}: {len(got)} batches, DataLoader has {len(expected)}"
            for seq, (g, e) in enumerate(zip(got, expected)):
                assert_tree_equal(g, e, f"rank {rank} batch {seq}")
            served.extend(int(i) for batch in got for i in batch[1])
        # the shards together: every sample (drop_last truncates, else pads by repeating the first ones)
        per_rank = length // WORLD if drop_last else -(-length // WORLD)
        if drop_last:
            per_rank_batches = per_rank // BATCH * BATCH
            assert len(served) == WORLD * per_rank_batches and len(set(served)) == len(served)
        else:
            assert len(served) == WORLD * per_rank and set(served) == set(range(length))
    finally:
        producer.close()
