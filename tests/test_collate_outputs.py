"""Any collate output reaches the training loop as DataLoader gives it (issue 18, "Any collate output"), through
local producers and through producers over the network (real processes, real sockets):

* a collate_fn whose output is not batch-first (torchvision detection's ``tuple(zip(*batch))``, a
  ``PackedSequence``) is not refused for its sample counts;
* dict and list subclasses keep their class, and a dataclass travels as itself;
* a class of the user's own travels between a trainer and its local producers (pickled, as DataLoader moves it),
  and over the network only when registered on both sides (``ferry.register_batch_type``); otherwise the loop
  gets a BatchTypeError that names the class and the call, whatever ``on_error`` says;
* an unbatched loader (``batch_size=None``) yields each sample as DataLoader's ``default_convert`` leaves it.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from ferry import BatchTypeError, RemoteLoader

from . import batch_type_datasets as bt
from .helpers import assert_tree_equal

OPTIONS = {"timeout": 60, "no_producer_timeout": 60, "heartbeat": 0.2, "log_every": None}
SPEC = "tests.batch_type_datasets"


def remote(spawn, endpoint: str, dataset: str, collate: str | None = None, **options) -> RemoteLoader:
    """A loader over one producer started by hand, serving ``dataset`` (10 samples) with ``--collate``."""
    loader = RemoteLoader(endpoint=endpoint, **{**OPTIONS, **options})
    spawn(endpoint, f"{SPEC}:{dataset}", {"length": 10}, extra=["--collate", f"{SPEC}:{collate}"] if collate else [])
    return loader


def assert_packed_equal(got, expected, where: str) -> None:
    assert type(got) is torch.nn.utils.rnn.PackedSequence, f"{where}: {type(got).__name__}"
    for field in expected._fields:
        assert_tree_equal(getattr(got, field), getattr(expected, field), f"{where}.{field}")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_detection_collate_s_tuples_of_samples_arrive_as_dataloader_makes_them(where, spawn, endpoint):
    """tuple(zip(*batch)) holds tuples of batch_size images and targets, 3 in the last batch: the producer was
    rejected for good ("batch[0][0] holds 3 samples, the task 4")."""
    expected = list(DataLoader(bt.Detection(10), batch_size=4, collate_fn=bt.detection_collate))
    if where == "local":
        loader = RemoteLoader(dataset=bt.Detection(10), local_producers=2, batch_size=4,
                              collate_fn=bt.detection_collate, **OPTIONS)
    else:
        loader = remote(spawn, endpoint, "Detection", "detection_collate", batch_size=4)
    with loader:
        for epoch in range(2):
            got = list(loader)
            assert len(got) == len(expected) == 3
            for i, (g, e) in enumerate(zip(got, expected)):
                assert_tree_equal(g, e, f"epoch {epoch} batch {i}")


def test_a_packed_sequence_arrives_from_a_producer_over_the_network(spawn, endpoint):
    expected = list(DataLoader(bt.Steps(10), batch_size=4, collate_fn=bt.packed_collate))
    with remote(spawn, endpoint, "Steps", "packed_collate", batch_size=4) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_packed_equal(g, e, f"batch {i}")


def test_dict_and_list_subclasses_keep_their_class_over_the_network(spawn, endpoint):
    expected = list(DataLoader(bt.Subclassed(10), batch_size=4))
    with remote(spawn, endpoint, "Subclassed", batch_size=4) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert type(g) is bt.CustomDict and type(g["pair"]) is bt.CustomList, f"batch {i}: {type(g)}"
        assert_tree_equal(g, e, f"batch {i}")


def test_a_dataclass_batch_arrives_as_its_class_over_the_network(spawn, endpoint):
    expected = list(DataLoader(bt.Steps(10), batch_size=4, collate_fn=bt.dataclass_collate))
    with remote(spawn, endpoint, "Steps", "dataclass_collate", batch_size=4) as loader:
        got = list(loader)
    assert len(got) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert type(g) is bt.Batch and g.note == "steps", f"batch {i}: {g!r}"
        assert_tree_equal(g.inputs, e.inputs, f"batch {i}.inputs")
        assert_tree_equal(g.labels, e.labels, f"batch {i}.labels")


def test_a_registered_class_travels_over_the_network(spawn, endpoint):
    expected = list(DataLoader(bt.Steps(10), batch_size=4, collate_fn=bt.registered_pair_collate))
    with remote(spawn, endpoint, "Steps", "registered_pair_collate", batch_size=4) as loader:
        got = list(loader)
    assert len(got) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert type(g) is bt.RegisteredPair, f"batch {i}: {type(g).__name__}"
        assert_tree_equal(g.inputs, e.inputs, f"batch {i}.inputs")
        assert_tree_equal(g.targets, e.targets, f"batch {i}.targets")


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_unregistered_class_over_the_network_is_an_error_naming_it_and_the_registration(spawn, endpoint, on_error):
    with remote(spawn, endpoint, "Steps", "unregistered_pair_collate", batch_size=4, on_error=on_error) as loader:
        with pytest.raises(BatchTypeError, match=r"UnregisteredPair.*ferry\.register_batch_type"):
            next(iter(loader))


def test_a_class_registered_only_on_the_producer_is_an_error_naming_it_and_the_registration(spawn, endpoint):
    with remote(spawn, endpoint, "Steps", "producer_only_pair_collate", batch_size=4) as loader:
        with pytest.raises(BatchTypeError, match=r"ProducerOnlyPair.*not registered in this process.*"
                                                 r"ferry\.register_batch_type"):
            next(iter(loader))
        assert len(loader.stats()["per_producer"]) == 1, "the producer was not rejected for it"


def test_an_unregistered_class_travels_between_a_trainer_and_its_local_producers(leak_check):
    expected = list(DataLoader(bt.Steps(10), batch_size=4, collate_fn=bt.unregistered_pair_collate))
    with RemoteLoader(dataset=bt.Steps(10), local_producers=2, batch_size=4,
                      collate_fn=bt.unregistered_pair_collate, **OPTIONS) as loader:
        got = list(loader)
    leak_check.assert_clean()
    assert len(got) == 3
    for i, (g, e) in enumerate(zip(got, expected)):
        assert type(g) is bt.UnregisteredPair, f"batch {i}: {type(g).__name__}"
        assert_tree_equal(g.inputs, e.inputs, f"batch {i}.inputs")


def test_an_unbatched_loader_over_the_network_yields_samples_as_default_convert_leaves_them(spawn, endpoint,
                                                                                           leak_check):
    expected = list(DataLoader(bt.Plain(10), batch_size=None))
    with remote(spawn, endpoint, "Plain", batch_size=None, shuffle=False) as loader:
        assert len(loader) == 10
        got = list(loader)
    for producer in spawn.started:
        assert producer.terminate() == 0
        producer.close()  # its log file too: the harness's, opened after the snapshot
    leak_check.assert_clean()
    assert len(got) == 10
    for i, (g, e) in enumerate(zip(got, expected)):
        assert type(g) is list and type(g[1]["i"]) is int and type(g[1]["name"]) is str, f"sample {i}: {g!r}"
        assert_tree_equal(g, e, f"sample {i}")
