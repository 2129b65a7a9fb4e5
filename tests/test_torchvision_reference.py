"""issue 30's first "Done when": torchvision's classification reference ``train.py`` (its loader set-up copied
faithfully, ``presets.py``'s transforms and RandAugment included: tests/torchvision_train.py and
tests/torchvision_presets.py) ported by changing only the import, gets identical indices, labels and pixel tensors
for 2 epochs however its batches are loaded: in the calling process, 1 producer, 4 producers, 4 with one SIGKILLed
mid-epoch, a SIGKILLed trainer resumed from ``state_dict()``; and under ``torchrun --nproc_per_node=2`` each rank's
batches are a single-process run of that rank's. The indices and labels are also torch's DataLoader's (its pixels are
not: each worker's random stream depends on which worker loads what).

Each run is the script in a fresh interpreter, as a user runs it (about 5 s each on 2 cores, 70 s in all): ``-m slow``.
The default suite's cheap cousin is tests/test_dataloader_port.py's same-pixels test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .helpers import REPO, free_port

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(REPO, "tests", "torchvision_train.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """An ImageFolder of 21 images in 3 classes, uint8 CHW of sizes between 36 and 55 pixels."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for label in range(3):
        folder = root / "train" / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(7):
            height, width = rng.integers(36, 56, size=2)
            np.save(folder / f"img{i}.npy", rng.integers(0, 256, size=(3, height, width), dtype=np.uint8))
    return str(root)


def train(data: str, out: str, *args: str, expect_kill: bool = False, torchrun: bool = False) -> str:
    """Run the script; its stderr."""
    command = [sys.executable, SCRIPT, "--data-path", data, "--out", out, *args]
    if torchrun:
        command[1:2] = ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    if expect_kill:
        assert done.returncode == -9, done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def run(data: str, tmp_path, name: str, *args: str) -> list[dict]:
    out = str(tmp_path / f"{name}.jsonl")
    train(data, out, *args)
    return records(out)


def without_pixels(batches: list[dict]) -> list[tuple]:
    return [(b["epoch"], b["indices"], b["labels"]) for b in batches]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> list[dict]:
    """ferry.DataLoader with 1 producer."""
    return run(data, tmp_path_factory.mktemp("reference"), "one", "--loader=ferry", "-j", "1")


def test_same_batches_and_pixels_with_1_or_4_producers_or_none(data, reference, tmp_path):
    assert len(reference) == 12 and {b["epoch"] for b in reference} == {0, 1}
    assert sorted(i for b in reference if b["epoch"] == 0 for i in b["indices"]) == list(range(21))
    assert len({b["pixels"] for b in reference}) == 12
    for workers in ("4", "0"):
        assert run(data, tmp_path, f"ferry{workers}", "--loader=ferry", "-j", workers) == reference
    torch_run = run(data, tmp_path, "torch", "--loader=torch", "-j", "2")
    assert without_pixels(torch_run) == without_pixels(reference)  # DataLoader's order and labels


def test_a_producer_killed_mid_epoch(data, reference, tmp_path):
    out = str(tmp_path / "killed.jsonl")
    stderr = train(data, out, "--loader=ferry", "-j", "4", "--kill-producer-after", "3")
    assert "killed by SIGKILL" in stderr
    assert records(out) == reference


@pytest.mark.parametrize("workers, die_after", [("4", 4), ("0", 8)])
def test_a_sigkilled_trainer_resumed_from_its_state(data, reference, tmp_path, workers, die_after):
    """SIGKILLed mid-epoch 0 (4 producers) or mid-epoch 1 (in the calling process), resumed from the checkpoint of
    its last batch (the loader's state_dict() and torch's generator state): the batches after it are the ones the
    uninterrupted run gave."""
    out, checkpoint = str(tmp_path / "resumed.jsonl"), str(tmp_path / "checkpoint.json")
    train(data, out, "--loader=ferry", "-j", workers, "--checkpoint", checkpoint, "--die-after", str(die_after),
          expect_kill=True)
    assert len(records(out)) == die_after
    train(data, out, "--loader=ferry", "-j", workers, "--resume", checkpoint)
    assert records(out) == reference


def test_each_rank_under_torchrun_is_its_single_process_run(data, tmp_path):
    out = str(tmp_path / "ranks.jsonl")
    train(data, out, "--loader=ferry", "-j", "2", torchrun=True)
    both = records(out)
    assert len(both) == 12  # 21 samples padded to 22, 11 per rank: 3 batches per epoch on each of 2 ranks
    for rank in range(2):
        alone = run(data, tmp_path, f"rank{rank}", "--loader=ferry", "-j", "2", "--rank-of", f"{rank}/2")
        assert len(alone) == 6 and all(b in both for b in alone)
    epoch0 = [i for b in both if b["epoch"] == 0 for i in b["indices"]]
    assert len(epoch0) == 22 and set(epoch0) == set(range(21))  # DistributedSampler's share of each, padded by one
