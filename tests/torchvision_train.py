"""torchvision's classification reference ``train.py``, its data loading set-up copied faithfully (``load_data``: an
``ImageFolder`` with ``presets.ClassificationPresetTrain``, RandAugment included; ``RandomSampler`` in one process,
``DistributedSampler`` under torchrun; ``DataLoader(dataset, batch_size, sampler, num_workers, pin_memory=True,
collate_fn=default_collate)``; ``train_sampler.set_epoch(epoch)`` each epoch when distributed), ported to Ferry by
changing only the import (``--loader ferry``). tests/test_torchvision_reference.py runs it.

Around the copy, what the tests need and train.py does not do: ``torch.manual_seed(0)`` first (so that two runs draw
alike), the sampler's indices recorded as the loop gets them (a wrapper that only watches), every batch written to
``--out`` (indices, labels, a digest of the pixel tensor), a checkpoint after each batch (the loader's ``state_dict()``
and torch's generator state, as a resumable trainer saves them), ``--die-after K`` (SIGKILL itself after K batches),
``--resume``, and ``--kill-producer-after K`` (SIGKILL one local producer after K batches).
"""

import argparse
import base64
import hashlib
import json
import os
import signal
import sys

import numpy as np
import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchvision_presets as presets  # noqa: E402  (torchvision's presets.py, copied: see its docstring)

if "--loader=ferry" in sys.argv:
    from ferry import DataLoader  # noqa: E402  the port: this line only
else:
    from torch.utils.data import DataLoader  # noqa: E402


# --- torchvision.datasets.ImageFolder (DatasetFolder), with a loader of uint8 CHW tensors stored as .npy ------------
class ImageFolder(torch.utils.data.Dataset):
    def __init__(self, root, transform=None, target_transform=None, loader=None, extensions=(".npy",)):
        self.root, self.transform, self.target_transform = root, transform, target_transform
        self.loader = loader or (lambda path: torch.from_numpy(np.load(path)))
        self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        self.class_to_idx = {cls_name: i for i, cls_name in enumerate(self.classes)}
        self.samples = []
        for target_class in sorted(self.class_to_idx):
            target_dir = os.path.join(root, target_class)
            for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
                for fname in sorted(fnames):
                    if fname.lower().endswith(extensions):
                        self.samples.append((os.path.join(dirpath, fname), self.class_to_idx[target_class]))
        self.targets = [s[1] for s in self.samples]

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __len__(self):
        return len(self.samples)


def load_data(traindir, args):
    print("Loading training data")
    dataset = ImageFolder(traindir, presets.ClassificationPresetTrain(
        crop_size=args.train_crop_size, auto_augment_policy=args.auto_augment, ra_magnitude=args.ra_magnitude))
    print("Creating data loaders")
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(dataset, **args.as_rank)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
    return dataset, train_sampler


class Watched(torch.utils.data.Sampler):
    """The sampler as it is, its indices recorded as they are drawn (the test's, not train.py's)."""

    def __init__(self, sampler):
        self.sampler, self.drawn = sampler, []

    def __iter__(self):
        for index in self.sampler:
            self.drawn.append(int(index))
            yield index

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)


def main(args):
    torch.manual_seed(0)
    if args.distributed and not args.as_rank:
        torch.distributed.init_process_group("gloo")
    dataset, train_sampler = load_data(os.path.join(args.data_path, "train"), args)
    train_sampler = Watched(train_sampler)
    data_loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, pin_memory=True,
        collate_fn=default_collate,
    )
    start_epoch = 0
    if args.resume:
        with open(args.resume) as f:
            checkpoint = json.load(f)
        start_epoch = checkpoint["epoch"]
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(checkpoint["rng"])), dtype=torch.uint8))
        data_loader.load_state_dict(checkpoint["loader"])
    done = 0
    with open(args.out, "a") as out:
        for epoch in range(start_epoch, args.epochs):
            if args.distributed:
                train_sampler.set_epoch(epoch)
            train_sampler.drawn = []
            seen = 0 if not (args.resume and epoch == start_epoch) else checkpoint["seen"]
            for image, target in data_loader:
                indices = train_sampler.drawn[seen:seen + len(target)]
                seen += len(target)
                out.write(json.dumps({"epoch": epoch, "indices": indices, "labels": target.tolist(),
                                      "pixels": hashlib.sha256(image.numpy().tobytes()).hexdigest()}) + "\n")
                out.flush()
                done += 1
                if args.checkpoint:
                    state = {"epoch": epoch, "seen": seen, "loader": data_loader.state_dict(),
                             "rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
                    with open(args.checkpoint + ".tmp", "w") as f:
                        json.dump(state, f)
                    os.replace(args.checkpoint + ".tmp", args.checkpoint)
                if done == args.kill_producer_after:
                    os.kill(data_loader._engine._local.pids[0], signal.SIGKILL)  # one of Ferry's local producers
                if done == args.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
    if hasattr(data_loader, "close"):
        data_loader.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", required=True)
    parser.add_argument("--loader", choices=("torch", "ferry"), default="torch")
    parser.add_argument("-b", "--batch-size", default=4, type=int)
    parser.add_argument("-j", "--workers", default=4, type=int)
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--train-crop-size", default=32, type=int)
    parser.add_argument("--auto-augment", default="ra", type=str)
    parser.add_argument("--ra-magnitude", default=9, type=int)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--resume", default="")
    parser.add_argument("--die-after", default=0, type=int)
    parser.add_argument("--kill-producer-after", default=0, type=int)
    parser.add_argument("--rank-of", default="", help="R/W: a single-process run of rank R of W (no process group)")
    args = parser.parse_args()
    args.distributed = "WORLD_SIZE" in os.environ or bool(args.rank_of)
    args.as_rank = {}
    if args.rank_of:
        rank, world = map(int, args.rank_of.split("/"))
        args.as_rank = {"num_replicas": world, "rank": rank}
    main(args)
