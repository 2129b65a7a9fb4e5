"""The CUDA staging path: reused pinned buffers, a side stream and events. Skipped without CUDA."""

import pytest
import torch

from ferry import RemoteLoader
from tests.datasets import DictDataset

from .helpers import assert_tree_equal, reference_batches

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")


def to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree


@cuda
@pytest.mark.parametrize("pin_memory", [True, False])
def test_batches_arrive_on_the_device_equal_to_dataloader(pin_memory):
    dataset = DictDataset(length=64)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=8, shuffle=True, device="cuda",
                      pin_memory=pin_memory, heartbeat=0.2, timeout=60) as loader:
        got = []
        for batch in loader:
            assert batch["image"].device.type == "cuda"
            got.append(to_cpu(batch))
    expected = reference_batches(dataset, batch_size=8, drop_last=False, world_size=1, rank=0, shuffle=True, seed=0,
                                 epoch=0)
    for g, e in zip(got, expected, strict=True):
        assert_tree_equal(g, e)


@cuda
def test_pinned_buffers_are_reused_and_device_transform_runs_on_device():
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 256, "shape": [3, 32, 32], "dtype": "uint8"},
                      local_producers=1, batch_size=16, device="cuda", heartbeat=0.2, timeout=60,
                      device_transform=lambda b: [b[0].float().div_(255), b[1]]) as loader:
        for x, y in loader:
            assert x.is_cuda and x.dtype == torch.float32 and float(x.max()) <= 1.0
        assert loader.stats()["batches"] == 16


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    from ferry.common.errors import ConfigError

    with pytest.raises(ConfigError, match="CUDA is not available"):
        RemoteLoader(endpoint="tcp://127.0.0.1:1", device="cuda", batch_size=2)
