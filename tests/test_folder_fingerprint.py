"""The fingerprint covers a folder dataset's content (issue 18): a producer serving the same folder with one class
renamed is refused, for a user's DatasetFolder-style dataset as for the built-ins; a dataset's own fingerprint
still wins. Real producer processes."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from ferry import RemoteLoader
from ferry.common.datasets import dataset_fingerprint, resolve_dataset
from tests.datasets import UserFolder

from .helpers import wait_for


@pytest.fixture
def folders(tmp_path):
    """``a``: two classes of 3 arrays; ``b``: the same files with the class ``cats`` renamed ``cots`` (same order,
    same labels, same length)."""
    for label, cls in enumerate(("cats", "dogs")):
        os.makedirs(tmp_path / "a" / cls)
        for i in range(3):
            np.save(tmp_path / "a" / cls / f"{i}.npy", np.full((2, 2), label * 10 + i, np.float32))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    os.rename(tmp_path / "b" / "cats", tmp_path / "b" / "cots")
    return tmp_path / "a", tmp_path / "b"


def test_a_renamed_class_changes_the_fingerprint_of_user_and_built_in_folders(folders):
    a, b = folders
    assert dataset_fingerprint(UserFolder(str(a))) != dataset_fingerprint(UserFolder(str(b)))
    assert dataset_fingerprint(UserFolder(str(a))) == dataset_fingerprint(UserFolder(str(a)))
    built_in = [dataset_fingerprint(resolve_dataset("npy-folder", {"root": str(root)})) for root in (a, b)]
    assert built_in[0] != built_in[1]

    class Own(UserFolder):
        fingerprint = "mine"

    assert dataset_fingerprint(Own(str(a))) == dataset_fingerprint(Own(str(b))) == "mine"


def test_a_producer_serving_the_folder_with_a_class_renamed_is_refused(folders, endpoint, spawn):
    a, b = folders
    with RemoteLoader(endpoint=endpoint, batch_size=3, heartbeat=0.2, timeout=30, log_every=None) as loader:
        spawn(endpoint, "tests.datasets:UserFolder", {"root": str(a)}, threads=1, slots=2)
        wait_for(lambda: loader.stats()["producers"] == 1, 20, "the first producer")
        renamed = spawn(endpoint, "tests.datasets:UserFolder", {"root": str(b)}, threads=1, slots=2)
        assert renamed.proc.wait(30) == 3, renamed.output()  # refused by every consumer: exit 3
        assert "rejected this producer" in renamed.output() and "fingerprint" in renamed.output()
        labels = sorted(int(v) for _, y in loader for v in y.tolist())
    assert labels == [0, 0, 0, 1, 1, 1]
