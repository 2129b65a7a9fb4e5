"""The CUDA staging path: registered slab slots, reused pinned buffers, a side stream and events. Skipped
without CUDA (the stager's bookkeeping is tested on the CPU with a stand-in runtime in tests/test_pinning.py).

What must hold on the first GPU these tests meet: batches from the shared-memory slab are copied from the
registered slots, with no pinned copy; pinned buffers are reused (not allocated per batch); neither a slot nor
a pinned buffer is overwritten before its host-to-device copy completed (every batch on the device equals the
dataset, with large batches, a slow loop and a fast one, over the slab and over the socket); and a loader on
CUDA leaves nothing behind, its registrations included."""

import gc

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common.datasets import SyntheticDataset
from tests.datasets import DictDataset

from .helpers import FullLeakCheck, assert_tree_equal, cuda_pinned_pool, cuda_stager, reference_batches

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


def _watch_acquisitions(pool) -> list[int]:
    """Spy on the real pinned pool: the address of every buffer it hands out."""
    handed: list[int] = []
    real = pool.acquire

    def acquire(nbytes: int):
        buffer = real(nbytes)
        handed.append(buffer.data_ptr())
        return buffer

    pool.acquire = acquire
    return handed


def _expected_on_device(dataset: SyntheticDataset, indices) -> torch.Tensor:
    return torch.from_numpy(np.stack([dataset.sample_array(int(i)) for i in indices])).cuda()


@cuda
def test_pinned_buffers_are_reused_and_device_transform_runs_on_device():
    """Over the socket (no slab): each frame is copied into a reused pinned buffer, then to the device."""
    args = {"length": 256, "shape": [3, 32, 32], "dtype": "uint8"}
    dataset = SyntheticDataset(**args)
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=1, batch_size=16, device="cuda",
                      shared_memory=False, heartbeat=0.2, timeout=60,
                      device_transform=lambda b: [b[0].float().div_(255), b[1]]) as loader:
        handed = _watch_acquisitions(cuda_pinned_pool(loader))  # before the first batch is staged
        for seq, (x, y) in enumerate(loader):
            indices = range(seq * 16, seq * 16 + 16)
            assert x.is_cuda and x.dtype == torch.float32
            assert torch.equal(x, _expected_on_device(dataset, indices).float().div_(255)), f"batch {seq}"
            assert y.is_cuda and y.cpu().tolist() == [i % dataset.num_classes for i in indices]
        assert loader.stats()["batches"] == 16
    assert len(handed) == 2 * 16, "one pinned buffer per leaf per batch"
    # a fresh pinned allocation per batch would be 32 buffers; reuse keeps a handful
    assert len(set(handed)) <= 8, f"{len(set(handed))} distinct pinned buffers for {len(handed)} leaves: not reused"


@cuda
def test_slab_batches_are_copied_from_their_registered_slots_with_no_pinned_copy():
    args = {"length": 128, "shape": [3, 64, 64], "dtype": "uint8"}
    dataset = SyntheticDataset(**args)
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, batch_size=16, device="cuda",
                      heartbeat=0.2, timeout=60, log_every=None) as loader:
        stager = cuda_stager(loader)
        handed = _watch_acquisitions(stager.pool)
        expected = reference_batches(dataset, batch_size=16, drop_last=False, world_size=1, rank=0, shuffle=False,
                                     seed=0, epoch=0)
        for seq, (x, y) in enumerate(loader):
            assert x.is_cuda and torch.equal(x.cpu(), expected[seq][0]), f"batch {seq} differs on the device"
            assert torch.equal(y.cpu(), expected[seq][1])
        assert loader.stats()["shared_batches"] == len(expected)
        assert handed == [], "a slab leaf was copied into a pinned buffer first"
        assert stager.direct == 2 * len(expected) and stager.through_pool == 0
        slab = loader._local.slab
        ranges = stager.registry.ranges()
        assert 0 < len(ranges) <= slab.slots  # one registration per slot used, never per batch
        assert stager.registry.calls == len(ranges)  # same-sized batches: no slot registered twice
        for start, nbytes in ranges.items():
            assert slab.slot_span(start, nbytes) is not None and (start - slab.address) % slab.slot_bytes == 0
    assert stager.registry.ranges() == {} and stager.registry.failures == 0


@cuda
@pytest.mark.parametrize("shared_memory", [True, False], ids=["slab", "socket"])
@pytest.mark.parametrize("step_s", [0.05, 0.0], ids=["slow loop", "fast loop"])
def test_no_batch_sees_its_source_overwritten_before_its_copy_completed(step_s, shared_memory):
    """32 MiB batches: each host-to-device copy takes long enough that a source handed out again too early
    (before the copy's event completed) would be overwritten under the copy: a slot written by the next
    batch's producer, or a pinned buffer filled with the next frame."""
    import time

    args = {"length": 96, "shape": [4, 1024, 1024], "dtype": "uint8"}
    dataset = SyntheticDataset(**args)
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, batch_size=8, shuffle=True, seed=9,
                      device="cuda", heartbeat=0.2, timeout=60, log_every=None,
                      shared_memory=shared_memory) as loader:
        expected = reference_batches(dataset, batch_size=8, drop_last=False, world_size=1, rank=0, shuffle=True,
                                     seed=9, epoch=0)
        kept: list[tuple[int, torch.Tensor]] = []
        for seq, (x, y) in enumerate(loader):
            assert x.is_cuda and torch.equal(x, expected[seq][0].cuda()), f"batch {seq} differs on the device"
            assert torch.equal(y.cpu(), expected[seq][1])
            kept = (kept + [(seq, x)])[-3:]  # the loop holds a few batches while later ones are staged
            time.sleep(step_s)
            for old, tensor in kept:
                assert torch.equal(tensor, expected[old][0].cuda()), f"batch {old} changed while the loop held it"
        assert seq + 1 == len(expected)
        if shared_memory:
            assert cuda_stager(loader).through_pool == 0 and cuda_stager(loader).direct == 2 * len(expected)


@cuda
def test_a_cuda_loader_leaves_nothing():
    args = {"length": 64, "shape": [3, 64, 64], "dtype": "uint8"}

    def one_loader() -> None:
        with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, batch_size=8, device="cuda",
                          heartbeat=0.2, timeout=60, log_every=None) as loader:
            for _ in range(2):
                for batch in loader:
                    assert batch[0].is_cuda
            del batch
            registry = cuda_stager(loader).registry
            assert registry.registered_bytes > 0
        assert registry.ranges() == {}, "host memory left registered with CUDA after close"

    one_loader()  # the first use of CUDA opens driver fds and starts driver threads: not ours to count
    gc.collect()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    check = FullLeakCheck()
    one_loader()
    gc.collect()
    torch.cuda.synchronize()
    check.assert_clean()
    assert torch.cuda.memory_allocated() == allocated, "device memory of the loader's batches was not freed"


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    from ferry.common.errors import ConfigError

    with pytest.raises(ConfigError, match="CUDA is not available"):
        RemoteLoader(endpoint="tcp://127.0.0.1:1", device="cuda", batch_size=2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_staging_thread_pins_and_registers_on_the_loaders_device_not_gpu_0():
    """A new thread starts on device 0; the staging thread makes the loader's device current first, or pinning
    and cudaHostRegister for a loader on cuda:1 would create a context on GPU 0 (in every DDP rank)."""
    import threading

    from ferry.consumer.staging.cuda import use_device as _use_device

    seen = []

    def staging_like() -> None:
        _use_device(torch.device("cuda:1"))
        seen.append(torch.cuda.current_device())

    thread = threading.Thread(target=staging_like)
    thread.start()
    thread.join(30)
    assert seen == [1]


def test_device_guard_and_use_device_do_nothing_without_cuda_devices():
    from ferry.consumer.staging.cuda import device_guard, use_device as _use_device

    _use_device(None)
    _use_device(torch.device("cpu"))
    with device_guard(torch.device("cpu")):
        pass
    if not torch.cuda.is_available():  # here: a CUDA device named on a machine without CUDA is no error either
        _use_device(torch.device("cuda:1"))
        with device_guard(torch.device("cuda:1")):
            pass


@pytest.mark.parametrize("device", ["mps", "xpu", "meta", torch.device("meta")])
def test_a_device_that_is_neither_cuda_nor_the_cpu_is_refused_with_the_way_to_move_batches(device, endpoint):
    """Batches stayed on the CPU without a word for these; the loader stages to CUDA only."""
    from ferry.common.errors import ConfigError

    name = str(torch.device(device))
    with pytest.raises(ConfigError, match=rf"^device='{name}': the loader stages batches to a CUDA device.*"
                                          r"device_transform="):
        RemoteLoader(endpoint="tcp://127.0.0.1:1", device=device, batch_size=2)
    RemoteLoader(endpoint=endpoint, device="cpu", batch_size=2).close()  # the CPU stays allowed
