"""DataLoader's surface: generator= seeds the shuffle, and DataLoader options Ferry does not take are refused
at once with what to use instead."""

from __future__ import annotations

import threading

import pytest
import torch

from ferry import ConfigError, ConfigTypeError, RemoteLoader

from .datasets import PairDataset


def _orders(**kwargs) -> list[list[int]]:
    with RemoteLoader(dataset=PairDataset(24), local_producers=1, batch_size=4, shuffle=True, timeout=60,
                      **kwargs) as loader:
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            out.append([int(i) for _, y in loader for i in y])
    return out


def test_generator_seeds_the_shuffle_reproducibly():
    a = _orders(generator=torch.Generator().manual_seed(11))
    b = _orders(generator=torch.Generator().manual_seed(11))
    c = _orders(generator=torch.Generator().manual_seed(12))
    assert a == b, "the same generator state gives the same shuffle"
    assert a != c, "another generator state gives another shuffle"
    assert sorted(a[0]) == list(range(24)) and a[0] != a[1]


@pytest.mark.parametrize("name,value,advice", [
    ("num_workers", 4, "local_producers"),
    ("prefetch_factor", 2, "buffer_batches"),
    ("persistent_workers", True, "persistent"),
    ("worker_init_fn", print, "producer_init"),
    ("multiprocessing_context", "spawn", "mp_context"),
])
def test_dataloader_only_options_say_what_to_use_instead(name, value, advice):
    threads = threading.active_count()
    with pytest.raises(ConfigError, match=advice):
        RemoteLoader(dataset=PairDataset(8), local_producers=1, batch_size=4, **{name: value})
    assert threading.active_count() == threads, "nothing may start before the options are checked"


def test_unknown_keywords_are_a_type_error_and_batch_size_none_with_drop_last_is_explained():
    with pytest.raises(ConfigTypeError, match="unexpected keyword argument 'bach_size'"):
        RemoteLoader(dataset=PairDataset(8), local_producers=1, bach_size=4)
    with pytest.raises(ConfigError, match="batch_size=None option disables auto-batching"):
        RemoteLoader(dataset=PairDataset(8), local_producers=1, batch_size=None, drop_last=True)
    with pytest.raises(ConfigError, match="both given"):
        RemoteLoader(dataset=PairDataset(8), local_producers=1, batch_size=4, seed=1,
                     generator=torch.Generator())
    with pytest.raises(ConfigTypeError, match="torch.Generator"):
        RemoteLoader(dataset=PairDataset(8), local_producers=1, batch_size=4, generator=7)
