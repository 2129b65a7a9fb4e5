"""Every sample type default_collate handles comes back with default_collate's exact types: namedtuples
stay namedtuples, strings inside tuples stay tuples, bfloat16/float16/bool/0-d keep their dtypes."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from ferry import RemoteLoader

from .helpers import assert_tree_equal
from .random_datasets import Point, Typed

KINDS = ["namedtuple", "tuple-of-strings", "bfloat16", "float16", "bool", "0-d"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "socket"])
def test_default_collate_types_survive_the_trip(kind, shared_memory):
    expected = list(DataLoader(Typed(kind), batch_size=4))
    with RemoteLoader(dataset=Typed(kind), local_producers=1, batch_size=4, timeout=60,
                      shared_memory=shared_memory) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_tree_equal(g, e, f"{kind} batch {i}")
    if kind == "namedtuple":
        assert type(got[0]) is Point and got[0].image.shape == (4, 2, 2), type(got[0])
