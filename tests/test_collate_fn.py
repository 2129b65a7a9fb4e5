"""A user's collate_fn runs on the producers and gives exactly DataLoader(collate_fn=...)'s batches."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from ferry import ConfigError, RemoteLoader

from .helpers import assert_tree_equal
from .random_datasets import Sequences, pad_collate


def _reference(epoch: int) -> list:
    sampler = DistributedSampler(Sequences(30), num_replicas=1, rank=0, shuffle=True, seed=5)
    sampler.set_epoch(epoch)
    return list(DataLoader(Sequences(30), batch_size=4, sampler=sampler, collate_fn=pad_collate))


def _check(loader: RemoteLoader) -> None:
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = [b for b in loader]
        expected = _reference(epoch)
        assert len(got) == len(expected) == 8
        for i, (g, e) in enumerate(zip(got, expected)):
            assert isinstance(g, tuple), f"batch {i}: collate_fn returned a tuple, got {type(g).__name__}"
            assert_tree_equal(g, e, f"epoch {epoch} batch {i}")


@pytest.mark.parametrize("dataset,collate_fn", [(Sequences(30), pad_collate),
                                                ("tests.random_datasets:Sequences",
                                                 "tests.random_datasets:pad_collate")],
                         ids=["object-and-callable", "spec-and-spec"])
def test_collate_fn_pads_like_dataloader_in_local_mode(dataset, collate_fn):
    args = {"length": 30} if isinstance(dataset, str) else None
    with RemoteLoader(dataset=dataset, dataset_args=args, local_producers=2, batch_size=4, shuffle=True, seed=5,
                      collate_fn=collate_fn, timeout=60) as loader:
        _check(loader)


def test_collate_with_remote_producers(spawn, endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=5, timeout=60) as loader:
        for _ in range(2):
            spawn(endpoint, "tests.random_datasets:Sequences", {"length": 30},
                  extra=["--collate", "tests.random_datasets:pad_collate"])
        _check(loader)


def test_collate_fn_errors_are_clear():
    with pytest.raises(ConfigError, match="local producers"):
        RemoteLoader(endpoint="tcp://127.0.0.1:1", batch_size=4, collate_fn=pad_collate)
    with pytest.raises(ConfigError, match="must be a spec too"):
        RemoteLoader(dataset="tests.random_datasets:Sequences", local_producers=1, batch_size=4,
                     collate_fn=pad_collate)
    with pytest.raises(ConfigError, match="callable"):
        RemoteLoader(dataset=Sequences(), local_producers=1, batch_size=4, collate_fn=3)


@pytest.mark.parametrize("transform", ["tests.random_datasets:negate", "callable"])
def test_producer_transform_with_a_dataset_object(transform):
    """A transform given with a dataset object, as a spec or as a callable, gives DataLoader's batches over
    the transformed samples (the spec used to fail on the dataset's fingerprint, the callable to crash)."""
    from .datasets import PairDataset
    from .random_datasets import negate

    class Negated:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return negate(PairDataset(20)[i])

    expected = list(DataLoader(Negated(), batch_size=4))
    with RemoteLoader(dataset=PairDataset(20), local_producers=2, batch_size=4, timeout=60,
                      producer_transform=negate if transform == "callable" else transform) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 5
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_tree_equal(g, e, f"batch {i}")
