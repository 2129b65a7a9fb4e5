"""Frameworks that take a DataLoader take ``ferry.DataLoader`` (issue 30): PyTorch Lightning's ``Trainer.fit`` (which
re-instantiates the loader with a ``DistributedSampler`` under DDP, from its ``__pl_saved_*`` arguments when built in
a hook, from its attributes when given to ``fit``) and Hugging Face Accelerate's ``prepare()`` (through
``ferry.accelerate.prepare``, which keeps Ferry's producers in the loader accelerate rebuilds). Each trains 2 epochs
under a 2-process DDP (CPU, gloo, ``torchrun``) with the real package, and every rank's batches equal that framework's
with torch's DataLoader, each sample loaded by Ferry (``ferry.sample_info()`` set), none by torch's workers.

Marker ``frameworks`` (about a minute: four torchrun runs of two processes each): ``.ci/run`` installs the pinned
versions (pyproject's ``frameworks`` extra, with torch==2.13.0 kept) and runs ``pytest -m frameworks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from . import needs
from .helpers import REPO, free_port

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(600)]

TRAINER = os.path.join(REPO, "tests", "framework_trainer.py")


def run(framework: str, kind: str, out: str) -> list[dict]:
    """Each rank's recorded run of ``framework`` over ``kind``'s loader, under torchrun with 2 processes."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", TRAINER, framework, kind, out],
                          capture_output=True, text=True, timeout=500, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ranks = []
    for rank in range(2):
        with open(os.path.join(out, f"{framework}-{kind}-{rank}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def batches(run: dict) -> list[list[list[int]]]:
    return [[b["indices"] for b in run[epoch]] for epoch in ("0", "1")]


def loaded_by_ferry(run: dict) -> set[bool]:
    return {b["ferry"] for epoch in ("0", "1") for b in run[epoch]}


def test_lightning_fit_under_ddp(tmp_path):
    needs.module("pytorch_lightning", "frameworks")
    theirs, ours = run("lightning", "torch", str(tmp_path)), run("lightning", "ferry", str(tmp_path))
    for rank in range(2):
        for way in ("hook", "given"):  # built in train_dataloader(), and given to fit()
            expected, got = theirs[rank][way], ours[rank][way]
            assert batches(got) == batches(expected)
            assert batches(got)[0] != batches(got)[1]  # DistributedSampler's set_epoch: another order
            assert loaded_by_ferry(got) == {True} and loaded_by_ferry(expected) == {False}
            assert got["loader0"] == ["DataLoader", "DistributedSampler", ["log_every"]]
    indices = [sorted(i for b in ours[rank]["hook"]["0"] for i in b["indices"]) for rank in range(2)]
    assert sorted(indices[0] + indices[1]) == list(range(22))  # each rank its share, the two make the epoch


@pytest.mark.parametrize("way", ["ferry", "ferry-helper"])
def test_accelerate_prepare_under_ddp(tmp_path, way):
    """``accelerator.prepare(loader)`` as it is (a ferry.DataLoader prepared in place), and the helper that returns
    accelerate's shard: each rank's batches are accelerate's with torch's DataLoader, every sample loaded by Ferry."""
    needs.module("accelerate", "frameworks")
    theirs, ours = run("accelerate", "torch", str(tmp_path)), run("accelerate", way, str(tmp_path))
    for rank in range(2):
        expected, got = theirs[rank]["prepared"], ours[rank]["prepared"]
        assert batches(got) == batches(expected) and batches(got)[0] != batches(got)[1]
        assert loaded_by_ferry(got) == {True} and loaded_by_ferry(expected) == {False}
        assert got["producers"] == 2
    assert batches(ours[0]["prepared"]) != batches(ours[1]["prepared"])


@pytest.mark.parametrize("imported_in_the_hook", [False, True])
def test_lightning_reinstantiation_keeps_ferrys_options(imported_in_the_hook):
    """The unit under the DDP test: Lightning's own re-instantiation (``_update_dataloader``) of a ferry.DataLoader
    built while its hook wraps DataLoaders' ``__init__``: with a DistributedSampler, Ferry's options kept, whether
    ferry.DataLoader was imported before the hook began (its own __init__ wrapped) or in it (only torch's wrapped)."""
    needs.module("pytorch_lightning", "frameworks")
    import importlib

    import torch
    from lightning_fabric.utilities.data import _replace_dunder_methods
    from pytorch_lightning.utilities.data import _update_dataloader
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    from . import port_datasets as pdata

    module = "ferry.consumer.dataloader.loader"
    importlib.import_module(module)
    saved = {name: sys.modules.pop(name) for name in list(sys.modules)
             if name.startswith("ferry.consumer.dataloader")} if imported_in_the_hook else {}
    try:
        with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
            loader = importlib.import_module(module).DataLoader(pdata.Indexed(8), batch_size=2, shuffle=True,
                                                                num_workers=1, log_every=None, heartbeat=0.5)
        sampler = DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=True)
        again = _update_dataloader(loader, sampler)
        assert type(again).__module__ == module and again.sampler is sampler and again.batch_size == 2
        assert again.ferry_options == {"log_every": None, "heartbeat": 0.5} and again.num_workers == 1
        assert isinstance(again, torch.utils.data.DataLoader)
    finally:
        sys.modules.update(saved)
