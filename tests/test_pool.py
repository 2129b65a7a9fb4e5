"""A producer pool with real processes (docs/deployment.md#one-pool-several-jobs): producers started without
--dataset serve each consumer the dataset it names, in DataLoader's order; a spec outside the allow-list is
refused, and both sides say why."""

from __future__ import annotations

import logging

import pytest

from ferry import NoProducersError, RemoteLoader
from ferry.common.datasets import SyntheticDataset
from tests.datasets import PairDataset
from tests.helpers import assert_epoch_matches, wait_for

SYNTHETIC = {"length": 24, "shape": [2, 3], "dtype": "float32"}


def test_one_pool_serves_each_consumer_the_dataset_it_names_in_dataloaders_order(endpoint, spawn):
    from tests.helpers import free_port

    other = f"tcp://127.0.0.1:{free_port()}"
    # one allowed by flag, the built-ins always; the other producer by its variable
    spawn([endpoint, other], "", threads=2, slots=2, extra=["--allow-dataset", "tests.datasets:PairDataset"])
    spawn([endpoint, other], "", threads=2, slots=2, env={"FERRY_ALLOW_DATASET": "tests.datasets:PairDataset"})
    with RemoteLoader(endpoint=endpoint, dataset="synthetic", dataset_args=SYNTHETIC, batch_size=5, shuffle=True,
                      seed=3, heartbeat=0.2, timeout=30) as synthetic, \
            RemoteLoader(endpoint=other, dataset="tests.datasets:PairDataset", dataset_args={"length": 13},
                         batch_size=4, shuffle=True, seed=4, heartbeat=0.2, timeout=30) as pairs:
        # both producers serve both (each its named dataset) before the epochs, so that both share the work
        wait_for(lambda: synthetic.stats()["producers"] == 2 and pairs.stats()["producers"] == 2, 60,
                 "both pool producers admitted by both consumers")
        for epoch in range(2):
            synthetic.set_epoch(epoch)
            pairs.set_epoch(epoch)
            assert_epoch_matches(synthetic, SyntheticDataset(**SYNTHETIC), epoch=epoch, batch_size=5, seed=3)
            assert_epoch_matches(pairs, PairDataset(length=13), epoch=epoch, batch_size=4, seed=4)
        assert synthetic.stats()["reissued"] == 0 and pairs.stats()["reissued"] == 0


def test_a_spec_outside_the_allow_list_is_refused_naming_it_on_both_sides(endpoint, spawn, caplog):
    caplog.set_level(logging.INFO, logger="ferry")
    with RemoteLoader(endpoint=endpoint, dataset="tests.datasets:PairDataset", dataset_args={"length": 8},
                      batch_size=4, heartbeat=0.2, no_producer_timeout=3) as loader:
        producer = spawn(endpoint, "", extra=["--allow-dataset", "tests.datasets:DictDataset"])
        assert producer.proc.wait(30) == 3  # rejected by its only consumer: exit 3, as any permanent REJECT
        assert "not allowed here" in producer.output() and "tests.datasets:DictDataset" in producer.output()
        with pytest.raises(NoProducersError, match="refused the dataset this loader names.*--allow-dataset"):
            next(iter(loader))
    errors = [r for r in caplog.records if "rejected producer" in r.getMessage()]
    assert errors and all(r.levelno == logging.ERROR for r in errors)
    assert "dataset='tests.datasets:PairDataset'" in errors[0].getMessage()


def test_a_consumer_naming_no_dataset_is_told_how_to_name_one_by_a_pool_without_its_own(endpoint, spawn):
    with RemoteLoader(endpoint=endpoint, dataset_len=8, batch_size=4, heartbeat=0.2, no_producer_timeout=3):
        producer = spawn(endpoint, "")
        assert producer.proc.wait(30) == 3
        assert "without --dataset" in producer.output() and "RemoteLoader(dataset=" in producer.output()
