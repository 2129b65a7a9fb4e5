"""``image-folder`` over ordinary photos (issue 18): mixed sizes, grayscale, RGBA and palette images become one
batch with ``mode="RGB"``, ``resize`` and ``crop``, as torchvision's PIL path would make them; ``ferry pack
--format tar`` keeps the encoded files (WebDataset's convention) and ``tar-shards`` decodes them as image-folder
does, with the same options."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests import needs

from ferry import RemoteLoader
from ferry.common.datasets import resolve_dataset
from ferry.common.errors import DatasetSpecError

from .helpers import REPO, producer_env

Image = needs.module("PIL.Image", "images")


@pytest.fixture
def photos(tmp_path):
    """Six photos of mixed sizes and modes in two class folders, as PNG and JPEG."""
    rng = np.random.default_rng(4)
    made = [("cats", "a.jpg", "RGB", (40, 30)), ("cats", "b.png", "L", (24, 36)), ("cats", "c.png", "RGBA", (33, 33)),
            ("dogs", "d.png", "P", (50, 20)), ("dogs", "e.jpg", "L", (28, 41)), ("dogs", "f.png", "RGB", (64, 48))]
    for cls, name, mode, (width, height) in made:
        os.makedirs(tmp_path / "photos" / cls, exist_ok=True)
        bands = {"RGB": 3, "L": 1, "RGBA": 4, "P": 1}[mode]
        pixels = rng.integers(0, 255, (height, width, bands), dtype=np.uint8).squeeze(-1 if bands == 1 else ())
        image = Image.fromarray(pixels) if mode != "P" else Image.fromarray(pixels).convert("P")
        image.save(tmp_path / "photos" / cls / name, **({"quality": 90} if name.endswith(".jpg") else {}))
    return tmp_path / "photos"


def torchvision_like(path, *, size: int, crop: int) -> np.ndarray:
    """``CenterCrop(crop)(Resize(size)(Image.open(path).convert("RGB")))`` in torchvision's PIL path, written out."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        w, h = image.size
        new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        image = image.resize(new, Image.Resampling.BILINEAR)
        top, left = int(round((image.height - crop) / 2.0)), int(round((image.width - crop) / 2.0))
        image = image.crop((left, top, left + crop, top + crop))
    return np.asarray(image).transpose(2, 0, 1)


def test_mixed_photos_become_one_rgb_batch_with_resize_and_crop(photos):
    args = {"root": str(photos), "mode": "RGB", "resize": 20, "crop": 16}
    with RemoteLoader(dataset="image-folder", dataset_args=args, local_producers=1, batch_size=6, heartbeat=0.2,
                      timeout=30, log_every=None) as loader:
        x, y = next(iter(loader))
    assert tuple(x.shape) == (6, 3, 16, 16) and str(x.dtype) == "torch.uint8" and y.tolist() == [0, 0, 0, 1, 1, 1]
    files = sorted(os.path.join(photos, c, f) for c in ("cats", "dogs") for f in os.listdir(photos / c))
    expected = np.stack([torchvision_like(f, size=20, crop=16) for f in files])
    assert np.array_equal(x.numpy(), expected)


def test_decoding_options_are_checked_and_part_of_the_fingerprint(photos):
    plain = resolve_dataset("image-folder", {"root": str(photos)})
    rgb = resolve_dataset("image-folder", {"root": str(photos), "mode": "RGB"})
    sized = resolve_dataset("image-folder", {"root": str(photos), "mode": "RGB", "resize": [12, 10]})
    assert len({plain.fingerprint, rgb.fingerprint, sized.fingerprint}) == 3
    assert sized[0][0].shape == (3, 12, 10) and rgb[1][0].shape == (3, 36, 24)  # b.png, grayscale, 24 wide
    for bad, cause in (({"mode": "RGBX"}, "mode must be one of"), ({"resize": 0}, "resize must be"),
                       ({"crop": [3]}, "crop must be")):
        with pytest.raises(DatasetSpecError, match=cause):
            resolve_dataset("image-folder", {"root": str(photos), **bad})
    small = resolve_dataset("image-folder", {"root": str(photos), "resize": 8, "crop": 12})
    with pytest.raises(Exception, match="smaller than the crop"):
        small[0]


@pytest.mark.parametrize("options", [{}, {"mode": "RGB", "resize": 20, "crop": 16}], ids=["as-is", "rgb-resized"])
def test_pack_tar_keeps_encoded_images_and_tar_shards_decodes_them_as_image_folder(photos, tmp_path, options):
    out = tmp_path / "tar"
    flags = [f for key, value in options.items() for f in ("--dataset-arg", f"{key}={value}")]
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", "tar", "--shard-samples", "4",
                          "--dataset", "image-folder", "--dataset-arg", f"root={photos}", *flags, str(out)],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    if options:  # the stored files are the originals: the command to serve them says how to decode them
        assert "--dataset-arg 'mode=RGB' --dataset-arg 'resize=20' --dataset-arg 'crop=[16,16]'" in run.stdout
    files = sorted(os.path.join(photos, c, f) for c in ("cats", "dogs") for f in os.listdir(photos / c))
    stored = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            stored.update({m.name: tar.extractfile(m).read() for m in tar if not m.name.endswith(".cls")})
    assert sorted(stored) == [f"{i:06d}{os.path.splitext(f)[1]}" for i, f in enumerate(files)]
    for i, f in enumerate(files):
        with open(f, "rb") as source:
            assert stored[f"{i:06d}{os.path.splitext(f)[1]}"] == source.read(), f"{f} must be stored as it is"
    source_bytes = sum(os.path.getsize(f) for f in files)
    tar_bytes = sum(os.path.getsize(s) for s in out.glob("*.tar"))
    assert tar_bytes < source_bytes + 2 * len(files) * 1024 + 2 * 10240  # headers, padding, end blocks
    folder = resolve_dataset("image-folder", {"root": str(photos), **options})
    shards = resolve_dataset("tar-shards", {"pattern": str(out), **options})
    samples = [s for name in shards.shards() for s in shards.iter_shard(name)]
    assert len(samples) == len(folder) == 6
    for i, (array, label) in enumerate(samples):
        expected, expected_label = folder[i]
        assert array.dtype == expected.dtype and np.array_equal(array, expected) and label == expected_label


def test_tiff_channels_resize_plane_by_plane_and_keep_their_dtype(tmp_path):
    tifffile = needs.module("tifffile", "images")
    os.makedirs(tmp_path / "a")
    tile = np.random.default_rng(0).integers(0, 65535, (13, 8, 6), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "a" / "0.tif", tile)
    dataset = resolve_dataset("image-folder", {"root": str(tmp_path), "resize": [4, 3], "crop": [2, 2]})
    array, _ = dataset[0]
    assert array.shape == (13, 2, 2) and array.dtype == np.uint16
    plane = np.asarray(Image.fromarray(tile[5].astype(np.float32)).resize((3, 4), Image.Resampling.BILINEAR))
    assert np.array_equal(array[5], np.rint(plane[1:3, 0:2]).astype(np.uint16))
    rgb = resolve_dataset("image-folder", {"root": str(tmp_path), "mode": "RGB"})
    with pytest.raises(Exception, match="13 channels cannot be read as mode 'RGB'"):
        rgb[0]
