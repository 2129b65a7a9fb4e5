"""ferry pack + the packed dataset: the same samples as the npy-folder it came from, one read each."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ferry.common.datasets import NpyFolderDataset, resolve_dataset
from ferry import RemoteLoader

from .helpers import REPO, assert_tree_equal, producer_env, reference_batches


@pytest.fixture
def folders(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "src"
    for label in ("a", "b", "c"):
        os.makedirs(src / label)
        for i in range(7):
            np.save(src / label / f"{i}.npy", rng.integers(0, 255, (2, 5, 5)).astype(np.uint8))
    out = tmp_path / "packed"
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", str(src), str(out), "--shard-mib", "0"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "packed 21 samples" in run.stdout
    return src, out


def test_packed_samples_equal_the_source(folders):
    src, out = folders
    source, packed = NpyFolderDataset(str(src)), resolve_dataset("packed", {"root": str(out)})
    assert len(packed) == 21 and len(packed.shards) == 21  # --shard-mib 0: one record per shard
    for i in range(21):
        a, la = source[i]
        b, lb = packed[i]
        assert la == lb and b.dtype == a.dtype and np.array_equal(a, b)


def test_packed_serves_dataloader_batches_through_producers(folders):
    src, out = folders
    with RemoteLoader(dataset="packed", dataset_args={"root": str(out)}, local_producers=2, batch_size=4,
                      shuffle=True, seed=2, heartbeat=0.2, timeout=30) as loader:
        got = list(loader)
    expected = reference_batches(NpyFolderDataset(str(src)), batch_size=4, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=2, epoch=0)
    for g, e in zip(got, expected, strict=True):
        assert_tree_equal(g, e)


def test_pack_refuses_mixed_shapes_and_packed_refuses_non_packed_folders(tmp_path, folders):
    src, _ = folders
    np.save(src / "a" / "9.npy", np.zeros((3, 5, 5), np.uint8))
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", str(src), str(tmp_path / "o")],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ferry pack: error: sample") and "packed records must all be" in lines[0]
    with pytest.raises(Exception, match="not a packed dataset"):
        resolve_dataset("packed", {"root": str(src)})
