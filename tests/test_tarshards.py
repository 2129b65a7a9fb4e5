"""``ferry pack --format tar`` and the ``tar-shards`` dataset: WebDataset shards that round-trip a map-style
dataset, decoded as npy-folder and image-folder decode, served as a sharded source through real producers."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests import needs
import torch

from ferry import RemoteLoader
from ferry.common.datasets import resolve_dataset
from ferry.common.datasets.tarshards import TarShardsDataset
from ferry.common.errors import SampleLoadError
from tests.datasets import PairDataset

from .helpers import REPO, producer_env


@pytest.fixture
def packed(tmp_path):
    out = tmp_path / "tar"
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", "tar", "--dataset",
                          "tests.datasets:PairDataset", "--dataset-arg", "length=23", "--shard-samples", "5", str(out)],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "packed 23 samples into 5 .tar shard(s)" in run.stdout
    return out


def test_pack_tar_round_trips_every_sample_in_order(packed):
    source = PairDataset(23)
    dataset = resolve_dataset("tar-shards", {"pattern": str(packed / "*.tar")})
    assert dataset.shards() == [f"shard-{i:05d}.tar" for i in range(5)]
    assert [dataset.shard_len(n) for n in dataset.shards()] == [5, 5, 5, 5, 3]
    samples = [s for name in dataset.shards() for s in dataset.iter_shard(name)]
    assert len(samples) == 23
    for i, (array, label) in enumerate(samples):
        expected, expected_label = source[i]
        assert array.dtype == expected.dtype and np.array_equal(array, expected), f"sample {i}"
        assert label == expected_label and isinstance(label, int)


def test_tar_shards_through_producers_equal_the_reference(packed):
    dataset = TarShardsDataset(str(packed))  # a folder means its *.tar
    with RemoteLoader(dataset="tar-shards", dataset_args={"pattern": str(packed / "*.tar")}, local_producers=2,
                      batch_size=2, shuffle=True, seed=6, log_every=None) as loader:
        got = list(loader)
    from torch.utils.data import DistributedSampler, default_collate

    sampler = DistributedSampler(range(5), num_replicas=1, rank=0, shuffle=True, seed=6)
    sampler.set_epoch(0)
    expected = []
    for index in sampler:
        samples = list(dataset.iter_shard(dataset.shards()[index]))
        expected += [default_collate(samples[i:i + 2]) for i in range(0, len(samples), 2)]
    assert len(got) == len(expected) == 14
    for g, e in zip(got, expected):
        assert torch.equal(g[0], e[0]) and torch.equal(g[1], e[1])


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_images_and_labels_decode_as_image_folder_does(tmp_path):
    Image = needs.module("PIL.Image", "images")
    tifffile = needs.module("tifffile", "images")
    rgb = np.random.default_rng(0).integers(0, 255, (6, 5, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    tif = io.BytesIO()
    planes = np.arange(13 * 4 * 3, dtype=np.uint16).reshape(13, 4, 3)
    tifffile.imwrite(tif, planes)
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        _add(tar, "x/0001.png", png.getvalue())
        _add(tar, "x/0001.cls", b"7\n")
        _add(tar, "x/0002.tif", tif.getvalue())
        _add(tar, "x/0002.cls", b"3")
        _add(tar, "x/0003.npy", b"")  # three members: a dict sample
    with tarfile.open(tmp_path / "a.tar", "a") as tar:
        buf = io.BytesIO()
        np.save(buf, np.ones(2, np.float32))
        _add(tar, "x/0004.npy", buf.getvalue())
        _add(tar, "x/0004.cls", b"1")
        _add(tar, "x/0004.meta.txt", b"hello")
    dataset = TarShardsDataset(str(tmp_path / "*.tar"))
    assert dataset.shards() == ["a.tar"]
    with pytest.raises(Exception, match="cannot decode sample 'x/0003'"):
        list(dataset.iter_shard("a.tar"))
    samples = list(zip(range(2), dataset.iter_shard("a.tar")))
    (_, (image, label)), (_, (planes_got, label2)) = samples
    assert image.shape == (3, 6, 5) and image.dtype == np.uint8 and np.array_equal(image, rgb.transpose(2, 0, 1))
    assert label == 7 and label2 == 3
    folder = tmp_path / "folder" / "c"  # the same files, read by image-folder
    folder.mkdir(parents=True)
    (folder / "a.png").write_bytes(png.getvalue())
    (folder / "b.tif").write_bytes(tif.getvalue())
    images = resolve_dataset("image-folder", {"root": str(tmp_path / "folder")})
    for got, (expected, _) in ((image, images[0]), (planes_got, images[1])):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_dict_samples_and_clear_errors(tmp_path):
    with tarfile.open(tmp_path / "b.tar", "w") as tar:
        buf = io.BytesIO()
        np.save(buf, np.arange(3))
        _add(tar, "k1.npy", buf.getvalue())
        _add(tar, "k1.cls", b"2")
        _add(tar, "k1.meta.txt", b"hello")
    (sample,) = TarShardsDataset(str(tmp_path)).iter_shard("b.tar")
    assert list(sample) == ["cls", "meta.txt", "npy"] and sample["cls"] == 2 and sample["meta.txt"] == b"hello"
    with pytest.raises(FileNotFoundError, match="no file matches"):
        TarShardsDataset(str(tmp_path / "none-*.tar"))
    with pytest.raises(Exception, match="no shard named"):
        next(TarShardsDataset(str(tmp_path)).iter_shard("missing.tar"))


def test_a_shard_cut_short_is_an_error_naming_it_not_a_shorter_shard(packed):
    """A trial's half-copied shard was read as 28 samples of 50, its last without its label, and failed only in
    collation, naming nothing."""
    whole = packed / "shard-00001.tar"
    data = whole.read_bytes()
    cut = packed / "shard-00001-cut.tar"
    cut.write_bytes(data[: (len(data) // 2) // 512 * 512])  # at a block boundary: tarfile reads on without a word
    dataset = TarShardsDataset(str(packed))
    for read in (lambda: list(dataset.iter_shard(cut.name)), lambda: dataset.shard_len(cut.name)):
        with pytest.raises(SampleLoadError, match=f"{cut}.* is cut short"):
            read()
    assert len(list(dataset.iter_shard(whole.name))) == 5  # the whole one still reads


def test_a_packed_dataset_round_trips_through_tar(tmp_path):
    """npy-folder -> ferry pack (packed) -> ferry pack --format tar --dataset packed -> tar-shards: the same
    samples, in order."""
    import os

    from ferry.common.datasets import NpyFolderDataset

    rng = np.random.default_rng(2)
    src = tmp_path / "src"
    for label in ("a", "b"):
        os.makedirs(src / label)
        for i in range(6):
            np.save(src / label / f"{i}.npy", rng.integers(0, 255, (2, 3, 3)).astype(np.uint8))

    def ferry(*args):
        run = subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True,
                             env=producer_env(), cwd=REPO, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout

    ferry("pack", str(src), str(tmp_path / "packed"))
    ferry("pack", "--format", "tar", "--shard-samples", "4", "--dataset", "packed", "--dataset-arg",
          f"root={tmp_path / 'packed'}", str(tmp_path / "tar"))
    assert "packed 12 samples into 3 .tar shard(s)" in ferry("pack", "--format", "tar", "--shard-samples", "4",
                                                              str(src), str(tmp_path / "tar2"))
    source = NpyFolderDataset(str(src))
    for folder in ("tar", "tar2"):
        dataset = TarShardsDataset(str(tmp_path / folder))
        samples = [s for name in dataset.shards() for s in dataset.iter_shard(name)]
        assert len(samples) == len(source) == 12
        for i, (array, label) in enumerate(samples):
            expected, expected_label = source[i]
            assert array.dtype == np.uint8 and np.array_equal(array, expected) and label == expected_label


def test_pack_arguments_are_checked(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", "tar", "--dataset", "synthetic",
                          "a", "b"], capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert run.returncode == 2 and "pack takes OUT with --dataset" in run.stderr


def test_tensor_samples_pack_like_arrays_and_a_bad_sample_names_its_parts_and_leaves_no_shard(tmp_path):
    """(tensor, int) samples pack as (array, int) do (the packed format took them, tar refused them naming only
    'tuple'); a sample of another kind is named with its parts' types, and the shards written before it go."""
    from ferry.common.datasets.tarpack import pack_tar
    from ferry.common.errors import DatasetError

    class Tensors:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return torch.tensor([i, 2 * i]), i

    pack_tar(Tensors(), str(tmp_path / "t"), shard_samples=2)
    samples = [s for name in ("shard-00000.tar", "shard-00001.tar", "shard-00002.tar")
               for s in TarShardsDataset(str(tmp_path / "t")).iter_shard(name)]
    assert [(array.tolist(), label) for array, label in samples] == [([i, 2 * i], i) for i in range(5)]

    class BadAtThree(Tensors):
        def __getitem__(self, i):
            return (torch.tensor([i]), i) if i < 3 else ([i], "three")

    with pytest.raises(DatasetError, match=r"sample 3 is a tuple of \(list, str\); tar packing takes"):
        pack_tar(BadAtThree(), str(tmp_path / "bad"), shard_samples=2)
    assert list((tmp_path / "bad").iterdir()) == []  # shard-00000.tar and shard-00001.tar were removed
