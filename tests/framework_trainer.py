"""A 2-epoch training run under a framework, started by torchrun (tests/test_frameworks.py): Lightning's
``Trainer.fit`` or Accelerate's ``prepare()``, over torch's DataLoader or ferry.DataLoader. Every rank writes the
indices of each epoch's batches, and whether each sample was loaded by Ferry (``ferry.sample_info()`` is set only in
Ferry's loading), to ``OUT/<framework>-<loader>-<rank>.json``.

Usage: torchrun --nproc_per_node=2 tests/framework_trainer.py lightning|accelerate torch|ferry OUT
"""

import json
import os
import sys

import torch
import torch.utils.data

import ferry
from ferry import DataLoader as FerryDataLoader  # the one-import port: imported before any framework hook runs

EPOCHS, SIZE, BATCH, WORKERS = 2, 22, 3, 2


class Tagged(torch.utils.data.Dataset):
    """Sample ``i``: ``x`` (a feature), its index, and whether Ferry loaded it."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int):
        return {"x": torch.tensor([float(index)]), "index": index, "ferry": ferry.sample_info() is not None}


def loader_class(kind: str):
    return FerryDataLoader if kind.startswith("ferry") else torch.utils.data.DataLoader


def make_loader(kind: str):
    options = {"log_every": None} if kind.startswith("ferry") else {}
    return loader_class(kind)(Tagged(), batch_size=BATCH, shuffle=True, num_workers=WORKERS, **options)


def record(seen: dict, epoch: int, batch) -> None:
    seen.setdefault(str(epoch), []).append({"indices": batch["index"].tolist(),
                                            "ferry": bool(batch["ferry"].all())})


def lightning(kind: str) -> dict:
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self, in_hook: bool) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: dict = {}
            self.in_hook = in_hook

        def training_step(self, batch, batch_idx):
            record(self.seen, self.current_epoch, batch)
            if batch_idx == 0:  # the loader Lightning trains on: its class, its sampler, Ferry's options kept
                loader = self.trainer.train_dataloader
                self.seen[f"loader{self.current_epoch}"] = [type(loader).__name__, type(loader.sampler).__name__,
                                                            sorted(getattr(loader, "ferry_options", {}))]
            return self.layer(batch["x"]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):  # built in the hook: Lightning saves its init arguments (__pl_saved_*)
            return make_loader(kind)

    runs = {}
    for in_hook in (True, False):  # re-instantiated from __pl_saved_* arguments, then from instance attributes
        torch.manual_seed(1)
        model = Model(in_hook)
        trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=EPOCHS, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=0)
        if in_hook:
            trainer.fit(model)
        else:
            trainer.fit(model, train_dataloaders=make_loader(kind))
        runs["hook" if in_hook else "given"] = model.seen
    return runs


def accelerate(kind: str) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(cpu=True)
    set_seed(1)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader(kind)
    if kind == "ferry-helper":  # the helper that returns accelerate's shard itself
        from ferry.accelerate import prepare

        model, optimizer, loader = prepare(accelerator, model, optimizer, loader)
    else:  # the plain call, whatever the loader: a ferry.DataLoader is prepared in place
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen: dict = {}
    for epoch in range(EPOCHS):
        for batch in loader:
            record(seen, epoch, batch)
            accelerator.backward(model(batch["x"]).sum())
            optimizer.step()
            optimizer.zero_grad()
    if kind.startswith("ferry"):
        seen["producers"] = loader.stats()["local_producers"]
    return {"prepared": seen}


if __name__ == "__main__":
    framework, kind, out = sys.argv[1:4]
    runs = (lightning if framework == "lightning" else accelerate)(kind)
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"{framework}-{kind}-{rank}.json"), "w") as f:
        json.dump(runs, f)
