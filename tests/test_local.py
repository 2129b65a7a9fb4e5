"""Local mode: RemoteLoader(dataset=..., local_producers=N) is a drop-in for DataLoader(num_workers=N)."""

import pytest
import torch
from torch.utils.data import DataLoader

from ferry.common.errors import RemoteSampleError
from ferry import RemoteLoader
from tests.datasets import DictDataset, FailingDataset

from .helpers import assert_tree_equal, reference_batches


def test_object_dataset_matches_dataloader():
    dataset = DictDataset(length=23)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=9, heartbeat=0.2,
                      timeout=30) as loader:
        assert len(loader) == len(DataLoader(dataset, batch_size=4))
        got = list(loader)
    expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0, shuffle=True, seed=9,
                                 epoch=0)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_tree_equal(g, e)


def test_spec_dataset_with_arguments():
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 10, "shape": [2, 2], "dtype": "uint8"},
                      local_producers=1, batch_size=4, heartbeat=0.2, timeout=30) as loader:
        x, y = next(iter(loader))
    assert x.dtype == torch.uint8 and x.shape == (4, 2, 2) and y.tolist() == [0, 1, 0, 1]


def test_sample_error_names_index_producer_and_remote_traceback():
    with RemoteLoader(dataset=FailingDataset(length=20, bad=(6,)), local_producers=1, batch_size=4, heartbeat=0.2,
                      timeout=30) as loader:
        it = iter(loader)
        assert next(it)[1].tolist() == [0, 1, 2, 3]
        with pytest.raises(RemoteSampleError) as info:
            next(it)
        error = info.value
        assert error.index == 6 and error.exc_type == "ValueError" and "corrupt sample 6" in error.message
        assert ":" in error.producer and "Traceback" in error.remote_traceback
        assert "in __getitem__" in error.remote_traceback
        assert next(it)[1].tolist() == [8, 9, 10, 11]  # the loop may go on after the error


def test_skip_mode_delivers_the_rest_of_the_batch():
    with RemoteLoader(dataset=FailingDataset(length=12, bad=(1, 8, 9, 10, 11)), local_producers=1, batch_size=4,
                      on_error="skip", heartbeat=0.2, timeout=30) as loader:
        got = [b[1].tolist() for b in loader]
        assert loader.stats()["skipped_samples"] == 5
    assert got == [[0, 2, 3], [4, 5, 6, 7]]  # the third batch failed entirely and is skipped


def test_local_producers_need_a_dataset():
    from ferry.common.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a dataset"):
        RemoteLoader(local_producers=2, batch_size=2)
