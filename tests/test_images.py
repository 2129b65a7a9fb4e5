"""image-folder: PNG, JPEG and 13-channel TIFF through real producers; the missing-extra error; transforms."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests import needs

from ferry import RemoteLoader

from .helpers import REPO, producer_env

PIL = needs.module("PIL.Image", "images")
tifffile = needs.module("tifffile", "images")


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(3)
    made = {}
    for label, cls in enumerate(("clouds", "fields")):
        os.makedirs(tmp_path / cls)
        for i in range(3):
            png = rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)
            PIL.fromarray(png).save(tmp_path / cls / f"{i}.png")
            made[(cls, f"{i}.png")] = png.transpose(2, 0, 1)
    return tmp_path, made


def test_png_samples_arrive_channels_first_and_exact(images):
    root, made = images
    with RemoteLoader(dataset="image-folder", dataset_args={"root": str(root)}, local_producers=1, batch_size=6,
                      heartbeat=0.2, timeout=30) as loader:
        x, y = next(iter(loader))
    assert x.shape == (6, 3, 6, 5) and str(x.dtype) == "torch.uint8" and y.tolist() == [0, 0, 0, 1, 1, 1]
    expected = [made[(cls, f"{i}.png")] for cls in ("clouds", "fields") for i in range(3)]
    assert np.array_equal(x.numpy(), np.stack(expected))


def test_jpeg_and_13_channel_tiff(tmp_path):
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    jpeg = np.full((8, 8, 3), 120, np.uint8)
    PIL.fromarray(jpeg).save(tmp_path / "a" / "0.jpg", quality=95)
    tile = np.random.default_rng(0).integers(0, 65535, (13, 8, 8), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "b" / "0.tif", tile)
    rgb = np.random.default_rng(1).integers(0, 255, (8, 6, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "b" / "1.tif", rgb, photometric="rgb")  # interleaved samples: (H, W, S)
    from ferry.common.datasets import resolve_dataset

    dataset = resolve_dataset("image-folder", {"root": str(tmp_path)})
    a, la = dataset[0]
    b, lb = dataset[1]
    assert a.shape == (3, 8, 8) and la == 0 and abs(int(a.mean()) - 120) <= 2  # JPEG is lossy
    assert b.shape == (13, 8, 8) and b.dtype == np.uint16 and lb == 1 and np.array_equal(b, tile)
    c, _ = dataset[2]
    assert c.shape == (3, 8, 6) and np.array_equal(c, rgb.transpose(2, 0, 1))


def test_missing_extra_is_a_clear_one_line_error(images):
    root, _ = images
    out = subprocess.run([sys.executable, "-m", "tests.block_images", "--connect", "tcp://127.0.0.1:5",
                          "--dataset", "image-folder", "--dataset-arg", f"root={root}"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ferry[images]'" in lines[0] and "Pillow" in lines[0]


def test_producer_side_transform_hook(images):
    root, made = images
    from tests.datasets import PairDataset

    with RemoteLoader(dataset="tests.datasets:PairDataset", dataset_args={"length": 6}, local_producers=1,
                      batch_size=3, heartbeat=0.2, timeout=30, producer_transform="tests.transforms:negate_and_tag"
                      ) as loader:
        x, y = next(iter(loader))
    assert y.tolist() == [100, 101, 102]
    assert np.array_equal(x.numpy(), -np.stack([PairDataset(6)[i][0] for i in range(3)]))
