"""The rds-folder dataset (issue 34) reads what real R's saveRDS writes: numeric, integer and logical vectors and
arrays, gzip-compressed as R does by default and with xz, bzip2 or none, from files of any extension, filled into
``shape`` as R's ``array(x, dim = shape)``. It refuses a file whose length does not match, naming it, also through a
real producer; ``ferry pack`` converts such a folder ahead of time."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ferry import RemoteLoader, RemoteSampleError
from ferry.common.datasets import RdsFolderDataset, dataset_fingerprint, resolve_dataset
from ferry.common.datasets.packed import PackedDataset
from ferry.common.errors import DatasetError, SampleLoadError

from . import needs
from .helpers import REPO, producer_env
from .rds_files import expected_sample, run_r, write_class_folders

SHAPE = (2, 3, 4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``tiles``: 2 classes of 3 gzip files named .png (the seed's layout); ``kinds``: one class folder of every way R
    saves a sample, and R's own reading of element [2, 3, 4] of the array file."""
    needs.module("rdata", "rds")
    base = tmp_path_factory.mktemp("rds")
    write_class_folders(str(base / "tiles"), SHAPE, 3)
    kinds = base / "kinds" / "a"
    os.makedirs(kinds)
    code = f"""
        v <- 0:23 + 0.0
        saveRDS(v, '{kinds}/1_gzip.png')
        saveRDS(v, '{kinds}/2_xz.rds', compress = 'xz')
        saveRDS(v, '{kinds}/3_bzip2', compress = 'bzip2')
        saveRDS(v, '{kinds}/4_none.rds', compress = FALSE)
        saveRDS(0:23, '{kinds}/5_integer.rds')
        a <- array(v, dim = c(2, 3, 4)); saveRDS(a, '{kinds}/6_array.rds')
        saveRDS(v %% 2 == 1, '{kinds}/7_logical.rds')
        cat(a[2, 3, 4], a[1, 2, 3], a[2, 1, 2])
    """
    seen = [float(x) for x in run_r(code).split()]
    return base, seen


def test_every_way_r_saves_a_sample_reads_as_r_indexes_it(files):
    base, (at_234, at_123, at_212) = files
    ds = RdsFolderDataset(str(base / "kinds"), shape=[2, 3, 4], dtype="float64")
    names = [os.path.basename(p) for p, _ in ds.samples]
    assert names == ["1_gzip.png", "2_xz.rds", "3_bzip2", "4_none.rds", "5_integer.rds", "6_array.rds",
                     "7_logical.rds"]
    expected = np.arange(24, dtype=np.float64).reshape(SHAPE, order="F")
    for i, name in enumerate(names):
        array, label = ds[i]
        assert label == 0 and array.shape == SHAPE and array.dtype == np.float64
        want = (expected % 2 == 1).astype(np.float64) if name.startswith("7") else expected
        np.testing.assert_array_equal(array, want, err_msg=name)
    array, _ = ds[5]  # R's a[2, 3, 4] is [1, 2, 3] here, as R itself printed it
    assert (array[1, 2, 3], array[0, 1, 2], array[1, 0, 1]) == (at_234, at_123, at_212)


def test_class_folders_give_labels_and_the_dtype_asked_for(files):
    base, _ = files
    ds = resolve_dataset("rds-folder", {"root": str(base / "tiles"), "shape": "2,3,4"})
    assert len(ds) == 6 and ds.classes == ["0", "1"]
    assert ds.array_layout() == (SHAPE, np.dtype(np.float32))
    for index in range(6):
        array, label = ds[index]
        assert label == index // 3
        np.testing.assert_array_equal(array, expected_sample(index // 3, index % 3, SHAPE))
    out = np.zeros(SHAPE, np.float32)
    assert ds.read_into(4, out) == 1
    np.testing.assert_array_equal(out, expected_sample(1, 1, SHAPE))


def test_a_file_of_another_length_is_refused_naming_it(files, tmp_path):
    base, _ = files
    ds = RdsFolderDataset(str(base / "tiles"), shape=[2, 3, 5])
    with pytest.raises(SampleLoadError, match=r"sample 2 from .*tiles/0/tile_002\.png.*24 values; shape \[2, 3, 5\] "
                                              r"needs 30"):
        ds[2]


def test_values_an_integer_dtype_cannot_hold_and_other_objects_are_refused_naming_the_file(files, tmp_path):
    base, _ = files
    with pytest.raises(SampleLoadError, match=r"tile_001\.png.*outside uint8's 0\.\.255"):
        RdsFolderDataset(str(base / "tiles"), shape=SHAPE, dtype="uint8")[1]  # values 10000..10023
    root = tmp_path / "odd" / "x"
    os.makedirs(root)
    run_r(f"saveRDS(c(0.5, 1), '{root}/frac.rds'); saveRDS(list(1, 2), '{root}/list.rds'); "
          f"saveRDS(c('a', 'b'), '{root}/text.rds')")
    odd = RdsFolderDataset(str(tmp_path / "odd"), shape=[2], dtype="int16")
    with pytest.raises(SampleLoadError, match=r"frac\.rds.*fractions"):
        odd[0]
    with pytest.raises(SampleLoadError, match=r"list\.rds.*not an R numeric"):
        odd[1]
    with pytest.raises(SampleLoadError, match=r"text\.rds.*not an R numeric"):
        odd[2]
    assert RdsFolderDataset(str(tmp_path / "odd"), shape=[2], dtype="float32")[0][0].tolist() == [0.5, 1.0]
    for bad in ({"shape": "2,a"}, {"shape": []}, {"shape": [2, 0]}, {"shape": [2], "dtype": "complex64"}):
        with pytest.raises(DatasetError):
            RdsFolderDataset(str(tmp_path / "odd"), **bad)


def test_the_fingerprint_covers_files_shape_and_dtype(files, tmp_path):
    base, _ = files
    tiles = str(base / "tiles")
    fingerprint = dataset_fingerprint(RdsFolderDataset(tiles, shape=SHAPE))
    assert fingerprint == dataset_fingerprint(RdsFolderDataset(tiles, shape="2,3,4"))
    assert fingerprint != dataset_fingerprint(RdsFolderDataset(tiles, shape=[6, 4]))
    assert fingerprint != dataset_fingerprint(RdsFolderDataset(tiles, shape=SHAPE, dtype="float64"))
    other = tmp_path / "copy"
    os.makedirs(other / "0")
    os.makedirs(other / "one")
    for name in os.listdir(base / "tiles" / "0"):
        os.link(base / "tiles" / "0" / name, other / "0" / name)
        os.link(base / "tiles" / "1" / name, other / "one" / name)
    assert dataset_fingerprint(RdsFolderDataset(str(other), shape=SHAPE)) != fingerprint  # a renamed class


def test_a_producer_sends_the_refusal_to_the_loop_as_a_remote_sample_error_naming_file_and_index(files):
    base, _ = files
    with RemoteLoader(dataset="rds-folder", dataset_args={"root": str(base / "tiles"), "shape": [2, 3, 5]},
                      local_producers=1, batch_size=2, log_every=None, no_producer_timeout=60) as loader:
        with pytest.raises(RemoteSampleError, match=r"tile_000\.png.*needs 30") as caught:
            next(iter(loader))
    assert caught.value.index == 0 and "SampleLoadError" in caught.value.exc_type


def test_ferry_pack_converts_an_rds_folder_ahead_of_time(files, tmp_path):
    base, _ = files
    out = tmp_path / "packed"
    done = subprocess.run([sys.executable, "-m", "ferry", "pack", "--dataset", "rds-folder", "--dataset-arg",
                           f"root={base / 'tiles'}", "--dataset-arg", "shape=[2,3,4]", str(out)],
                          capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    packed = PackedDataset(str(out))
    assert len(packed) == 6 and packed.classes == ["0", "1"]
    for index in range(6):
        array, label = packed[index]
        assert label == index // 3
        np.testing.assert_array_equal(array, expected_sample(index // 3, index % 3, SHAPE))
