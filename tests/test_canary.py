"""Admission checks the data, not only the files (issue 30, point 1): a producer whose samples differ from the
trainer's (another crop size, the validation transform on the training files) is refused, naming the sample and
what differs, though its fingerprint (class, length, files) is the trainer's. The rule and the core without
processes; then real producers by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common.canary import Canary, as_wire, canary_indices, from_wire, mismatch, probe, structure
from ferry.consumer.core.admission import Peers
from ferry.consumer.core.dispatcher import Dispatcher

from .helpers import wait_for
from .random_datasets import Tiles


class _Varies:
    """A dataset with randomness of its own (a generator nobody seeds): its canaries have no digest."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return self.rng.standard_normal(3).astype(np.float32)


# --- the rule ------------------------------------------------------------------------------------------------
def test_canaries_are_the_first_and_last_samples_and_not_for_the_built_ins():
    from ferry.common.canary import checked
    from ferry.common.datasets import SyntheticDataset, Transformed

    assert canary_indices(100) == [0, 99] and canary_indices(1) == [0] and canary_indices(0) == []
    assert checked(Tiles(4)) and not checked(SyntheticDataset(length=4))
    assert checked(Transformed(SyntheticDataset(length=4), lambda sample: sample))


def test_a_transform_drawn_from_the_seeded_generators_gives_the_same_canaries_twice():
    first, again = probe(Tiles(8), canary_indices(8)), probe(Tiles(8), canary_indices(8))
    assert first == again and all(c.digest is not None for c in first)
    assert first[0].structure == "tuple[Tensor float32 (3, 8, 8), int, ]"


def test_another_crop_another_transform_and_other_values_are_named():
    train = probe(Tiles(8), canary_indices(8))
    crop = mismatch(train, probe(Tiles(8, size=6), canary_indices(8)), "this trainer's")
    assert crop is not None and "its sample 0 is tuple[Tensor float32 (3, 6, 6)" in crop
    assert "this trainer's is tuple[Tensor float32 (3, 8, 8)" in crop
    val = mismatch(train, probe(Tiles(8, train=False), canary_indices(8)), "this trainer's")
    assert val is not None and "its sample 0 holds other values than this trainer's" in val
    assert mismatch(train, probe(Tiles(8), canary_indices(8)), "this trainer's") is None


def test_a_dataset_with_randomness_of_its_own_is_checked_for_structure_only():
    canaries = probe(_Varies(), canary_indices(4))
    assert all(c.digest is None for c in canaries)
    other = [Canary(c.index, c.structure, "0" * 32) for c in canaries]
    assert mismatch(canaries, other, "this trainer's") is None
    assert mismatch(canaries, [Canary(0, "ndarray float64 (3,)", None)], "x") is not None


def test_a_dataset_whose_samples_name_their_process_says_so_and_is_checked_for_structure_only():
    from ferry.common.datasets import Transformed

    from .datasets import PidDataset

    assert all(c.digest is None for c in probe(PidDataset(8), canary_indices(8)))
    assert all(c.digest is None for c in probe(Transformed(PidDataset(8), lambda s: s), canary_indices(8)))
    assert all(c.digest is not None for c in probe(Tiles(8), canary_indices(8)))


def test_structure_names_containers_dtypes_and_shapes():
    sample = {"image": np.zeros((2, 3), np.uint8), "label": 3, "name": "a", "extra": [torch.zeros(2, dtype=torch.int64)]}
    assert structure(sample) == ("dict{'image': ndarray uint8 (2, 3), 'label': int, 'name': str, "
                                 "'extra': list[Tensor int64 (2,), ], }")


def test_the_core_refuses_a_producer_whose_canaries_differ_and_adopts_the_first_without_its_own():
    def hello(canaries, producer="p"):
        return {"producer": producer, "nonce": producer, "host": "h", "pid": len(producer), "slots": 1,
                "dataset": {"spec": "tests.random_datasets:Tiles", "len": 8, "fingerprint": "f",
                            "canary": as_wire(canaries)}}

    train, crop = probe(Tiles(8), canary_indices(8)), probe(Tiles(8, size=6), canary_indices(8))
    trainer = Peers(Dispatcher(4, 3), dataset_len=8, fingerprint="f", shm_token=None, now=0.0,
                    canaries=tuple(train))
    assert trainer.admit(b"a", hello(train, "a"), 1.0).reject is None
    refused = trainer.admit(b"b", hello(crop, "b"), 1.0).reject
    assert refused.startswith("its data differs: its sample 0 is") and "this trainer's" in refused
    spec_only = Peers(Dispatcher(4, 3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0)
    assert spec_only.admit(b"a", hello(crop, "a"), 1.0).reject is None
    refused = spec_only.admit(b"b", hello(train, "b"), 1.0).reject
    assert refused is not None and "the first producer's (h:1)" in refused
    assert from_wire(as_wire(train)) == train


# --- real producers -----------------------------------------------------------------------------------------
def _refused(producer) -> str:
    assert producer.proc.wait(60) == 3, producer.output()  # every consumer rejected it
    return producer.output()


def test_a_producer_with_the_validation_transform_or_another_crop_is_refused(endpoint, spawn):
    spec = "tests.random_datasets:Tiles"
    with RemoteLoader(endpoint=endpoint, dataset=Tiles(16), batch_size=4, timeout=60, log_every=None) as loader:
        val = spawn(endpoint, spec, {"length": 16, "train": False})
        crop = spawn(endpoint, spec, {"length": 16, "size": 6})
        good = spawn(endpoint, spec, {"length": 16}, threads=None)
        assert "its data differs: its sample 0 holds other values than this trainer's" in _refused(val)
        assert "its sample 0 is tuple[Tensor float32 (3, 6, 6), int, ]" in _refused(crop)
        batches = list(loader)
        assert sum(len(y) for _, y in batches) == 16
        assert good.proc.poll() is None


@pytest.mark.slow  # two producers started one after the other (.ci/run runs -m slow)
def test_with_only_a_spec_the_first_producers_samples_are_the_reference(endpoint, spawn):
    spec = "tests.random_datasets:Tiles"
    with RemoteLoader(endpoint=endpoint, dataset=spec, batch_size=4, timeout=60, log_every=None) as loader:
        first = spawn(endpoint, spec, {"length": 16})
        wait_for(lambda: loader.stats()["producers"] == 1, 60, "the first producer")
        other = spawn(endpoint, spec, {"length": 16, "size": 6})
        assert "the first producer's" in _refused(other)
        assert sum(len(y) for _, y in loader) == 16
        assert first.proc.poll() is None


def test_a_producer_running_other_code_for_the_spec_is_warned_about(tmp_path):
    """Its samples agree (else it would be refused), but its module's source is not this trainer's copy: a producer
    left from another version. Warned about, loudly, naming it."""
    from ferry.common.canary import code_digest
    from ferry.consumer.core.greeting import Greeting  # noqa: F401  (the warning is logged there)

    module = tmp_path / "stale_data.py"
    module.write_text("VERSION = 1\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        mine = code_digest("stale_data:Make")
    finally:
        sys.path.remove(str(tmp_path))
    assert mine is not None and code_digest("synthetic") is None
    peers = Peers(Dispatcher(4, 3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0,
                  dataset_spec="stale_data:Make", code=mine)
    hello = {"producer": "p", "nonce": "n", "host": "h", "pid": 7, "slots": 1,
             "dataset": {"spec": "stale_data:Make", "len": 4, "fingerprint": "f", "code": "0" * 32}}
    admission = peers.admit(b"a", hello, 1.0)
    assert admission.reject is None
    assert "producer h:7 runs other code for dataset 'stale_data:Make' than this trainer's copy" in admission.warning
    same = dict(hello, producer="q", nonce="m", pid=8, dataset=dict(hello["dataset"], code=mine))
    assert peers.admit(b"b", same, 1.0).warning == ""


def test_a_slow_first_sample_ends_the_probe_and_a_dataset_may_opt_out(monkeypatch):
    import ferry.common.canary as canary

    class Slow(Tiles):
        def __getitem__(self, index):
            loads.append(index)
            return super().__getitem__(index)

    loads: list[int] = []
    monkeypatch.setattr(canary, "CANARY_BUDGET_S", -1.0)  # every load is "slow"
    assert probe(Slow(8), canary_indices(8)) == [Canary(0, "tuple[Tensor float32 (3, 8, 8), int, ]", None)]
    assert loads == [0], "one load at most when samples are slow"

    class Waits(Tiles):
        canary = False

    assert not canary.checked(Waits(4))
