"""Seeds for every producer (issue 18, part 6), checked the way PyTorch's own ``test_dataloader.py`` checks its
workers (``test_worker_seed``, ``test_worker_seed_reproducibility``): each of 6 local producers is seeded
from ``(base seed, producer id)`` and loads a sample, so 6 distinct seeds come back, and two loaders built
with the same generator state see the same ones. Real processes. These are the process seeds, which per-sample
seeding (on by default for a dataset class of your own: tests/test_seed_per_sample.py) replaces while a sample
loads, so it is off here."""

from __future__ import annotations

import torch

from ferry import RemoteLoader

from tests.lifecycle_datasets import SynchronizedSeedDataset

WORKERS = 6
MASK = (1 << 63) - 1


def _seeds(generator_seed: int, workers: int = WORKERS, **ranks: int) -> set[int]:
    """The seeds of ``workers`` local producers, each loading one sample (``ranks``: rank=, world_size=)."""
    dataset = SynchronizedSeedDataset(workers * ranks.get("world_size", 1), workers)
    with RemoteLoader(dataset=dataset, local_producers=workers, batch_size=1, timeout=30, seed_per_sample=False,
                      generator=torch.Generator().manual_seed(generator_seed), **ranks) as loader:
        seeds = {int(batch) for batch in loader}
    assert -1 not in seeds, f"a sample waited in vain for the others: fewer than {workers} producers were loading"
    return seeds


def _base_seed(generator_seed: int) -> int:
    """The producers' base seed: the generator's first draw, as DataLoader's first iteration draws its workers'
    (it is the loader's seed too), as documented."""
    generator = torch.Generator().manual_seed(generator_seed)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def test_each_of_6_producers_loads_a_sample_with_its_own_seed():
    seeds = _seeds(42)
    base = _base_seed(42)
    assert seeds == {(base + worker) & MASK for worker in range(WORKERS)}


def test_two_loaders_with_the_same_generator_state_see_the_same_seeds():
    assert _seeds(7) == _seeds(7)


def test_ranks_seeded_alike_give_their_producers_streams_of_their_own():
    """A DDP trial: every rank called torch.manual_seed(0), and producer 0 of rank 0 and of rank 1 drew the same
    values (as DataLoader's workers do). Rank 0 keeps DataLoader's seeds; rank 1's producers get others, and the
    same ones again from the same state."""
    base = _base_seed(5)
    rank0 = _seeds(5, workers=2, rank=0, world_size=2)
    rank1 = _seeds(5, workers=2, rank=1, world_size=2)
    assert rank0 == {base, base + 1}
    assert len(rank1) == 2 and not rank0 & rank1, (rank0, rank1)
    assert _seeds(5, workers=2, rank=1, world_size=2) == rank1
