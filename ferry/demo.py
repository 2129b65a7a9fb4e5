"""``ferry demo``: the built-in default job.

It writes a small synthetic 13-channel dataset of ``.npy`` tiles in class folders, starts local producers
that read it, trains a small CNN on the CPU for a few epochs, and prints throughput and data stall per
epoch, measured by the loader itself (``loader.stats()``), not by wall-clock stamps around the loop.

It never destroys: every flag is checked before anything is written, and ``--data-dir`` must be missing,
empty, or a folder the demo made earlier (it holds the ``.ferry-demo`` marker, written before any tile).
Anything else is refused with one line and exit status 2; the user's files are left as they are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

#: Written into --data-dir before any tile: the folder is the demo's, to fill again or reuse.
OWNER_MARKER = ".ferry-demo"
#: Written after the last tile: the dataset is whole and is reused as it is.
COMPLETE_MARKER = ".ferry-demo-complete"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--samples", type=int, default=env("FERRY_SAMPLES", "512"),
                        help="samples in the dataset (default 512) [env FERRY_SAMPLES]")
    parser.add_argument("--size", type=int, default=env("FERRY_SIZE", "64"), help="tile height and width (default 64)")
    parser.add_argument("--channels", type=int, default=13, help="channels per tile (default 13)")
    parser.add_argument("--batch-size", type=int, default=env("FERRY_BATCH_SIZE", "32"),
                        help="batch size (default 32) [env FERRY_BATCH_SIZE]")
    parser.add_argument("--producers", type=int, default=env("FERRY_PRODUCERS", "2"),
                        help="local producer processes (default 2); 0 trains on remote producers that connect "
                             "to --endpoint [env FERRY_PRODUCERS]")
    parser.add_argument("--endpoint", default=env("FERRY_ENDPOINT"),
                        help="bind the consumer here too, on a private address (e.g. tcp://10.0.0.5:5555), so that "
                             "remote producers can join "
                             "[env FERRY_ENDPOINT]")
    parser.add_argument("--min-producers", type=int, default=env("FERRY_MIN_PRODUCERS", "0"),
                        help="wait (up to --timeout) until this many producers have joined before training "
                             "[env FERRY_MIN_PRODUCERS]")
    parser.add_argument("--threads", type=int, default=4, help="loader threads per producer (default 4)")
    parser.add_argument("--epochs", type=int, default=env("FERRY_EPOCHS", "1"),
                        help="epochs to train (default 1) [env FERRY_EPOCHS]")
    parser.add_argument("--data-dir", default=env("FERRY_DATA_DIR"),
                        help="where the dataset lives; generated there if the folder is missing or empty, reused "
                             "if the demo made it; any other folder is refused (default: a temporary folder, "
                             "removed afterwards) [env FERRY_DATA_DIR]")
    parser.add_argument("--data-only", action="store_true",
                        help="only generate the dataset into --data-dir, then exit (the compose data service)")
    parser.add_argument("--timeout", type=float, default=env("FERRY_TIMEOUT", "120"),
                        help="seconds to wait for producers (default 120) [env FERRY_TIMEOUT]")
    parser.add_argument("--seed", type=int, default=0, help="shuffle and data seed (default 0)")
    parser.add_argument("--metrics-port", type=int, default=env("FERRY_METRICS_PORT"),
                        help="serve the loader's Prometheus metrics on this port (ferry_producers_needed, the gauge "
                             "an engine scales producers on; needs ferry[metrics]) [env FERRY_METRICS_PORT]")


_MINIMUM = {"samples": 1, "size": 1, "channels": 1, "batch_size": 1, "producers": 0, "min_producers": 0,
            "threads": 1, "epochs": 1, "seed": 0}


def validate(args: argparse.Namespace) -> None:
    """Check every flag before anything is written.

    Raises:
        ValueError: a flag out of range, or a combination that cannot work; the message names the flag.
    """
    for name, least in _MINIMUM.items():
        if getattr(args, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.data_only and not args.data_dir:
        raise ValueError("--data-only needs --data-dir")


def check_data_dir(root: str) -> None:
    """Refuse a folder the demo may not write into: one that exists and holds anything but the demo's own.

    Raises:
        ValueError: ``root`` is not a folder, or holds files that the demo did not write.
    """
    if not os.path.lexists(root):
        return
    if not os.path.isdir(root):
        raise ValueError(f"--data-dir {root} exists and is not a folder; choose a new or empty folder")
    entries = os.listdir(root)
    if entries and OWNER_MARKER not in entries and COMPLETE_MARKER not in entries:
        raise ValueError(f"--data-dir {root} holds {len(entries)} entries that ferry demo did not write; it "
                         f"writes only into a new or empty folder, or one it made earlier")


def make_dataset(root: str, *, samples: int, channels: int, size: int, seed: int) -> None:
    """Write ``samples`` float32 tiles into ``root/0`` and ``root/1``; class 1 is brighter."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for label in (0, 1):
        os.makedirs(os.path.join(root, str(label)), exist_ok=True)
    for i in range(samples):
        label = i % 2
        tile = rng.standard_normal((channels, size, size), dtype=np.float32) + 0.5 * label
        np.save(os.path.join(root, str(label), f"{i:06d}.npy"), tile)


def build_model(channels: int):
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1),
    )


def ensure_dataset(root: str, args: argparse.Namespace) -> None:
    """Generate the demo dataset into ``root`` unless it is already there (a shared volume, say)."""
    marker = os.path.join(root, COMPLETE_MARKER)
    if os.path.exists(marker):
        print(f"ferry demo: using the dataset in {root}", flush=True)
        return
    check_data_dir(root)
    os.makedirs(root, exist_ok=True)
    open(os.path.join(root, OWNER_MARKER), "w").close()  # before any tile: a half-written folder is ours too
    started = time.monotonic()
    make_dataset(root, samples=args.samples, channels=args.channels, size=args.size, seed=args.seed)
    open(marker, "w").close()
    mb = args.samples * args.channels * args.size * args.size * 4 / 1e6
    print(f"ferry demo: wrote {args.samples} tiles of {args.channels}x{args.size}x{args.size} float32 "
          f"({mb:.0f} MB) to {root} in {time.monotonic() - started:.1f} s", flush=True)


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    validate(args)
    if args.data_dir and (args.producers or args.data_only):
        check_data_dir(args.data_dir)
    if args.data_only:
        ensure_dataset(args.data_dir, args)
        return 0

    import torch

    from ferry import RemoteLoader, keep_freed_memory

    def stop(signum, frame):  # docker compose down: close the loader (BYE to producers), exit cleanly
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    keep_freed_memory()  # batches from remote producers arrive over a socket (docs/tuning.md#frame-size)
    torch.manual_seed(args.seed)
    root = args.data_dir or tempfile.mkdtemp(prefix="ferry-demo-")
    try:
        if args.producers:
            ensure_dataset(root, args)
        model = build_model(args.channels)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        where = {} if args.endpoint is None else {"endpoint": args.endpoint}
        local = {"dataset": "npy-folder", "dataset_args": {"root": root}, "local_producers": args.producers,
                 "producer_threads": args.threads} if args.producers else {}
        metrics = {} if args.metrics_port is None else {"metrics_port": args.metrics_port}
        with RemoteLoader(**where, **local, **metrics, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                          no_producer_timeout=args.timeout) as loader:
            if args.min_producers:
                deadline = time.monotonic() + args.timeout
                while loader.stats()["producers"] < args.min_producers:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"only {loader.stats()['producers']} of {args.min_producers} producers "
                                           f"joined within {args.timeout:g} s")
                    time.sleep(0.05)
            source = f"{args.producers} local producers" if args.producers else f"remote producers at {args.endpoint}"
            print(f"ferry demo: {source}, {len(loader)} batches of {args.batch_size} per epoch", flush=True)
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                before = loader.stats()
                samples, loss_sum, correct = 0, 0.0, 0
                for x, y in loader:
                    logits = model(x).squeeze(1)
                    loss = loss_fn(logits, y.float())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    samples += len(y)
                    loss_sum += loss.item() * len(y)
                    correct += int(((logits > 0).long() == y).sum())
                after = loader.stats()
                active = after["active_s"] - before["active_s"]
                moved = (after["bytes"] - before["bytes"]) / 1e6
                print(f"epoch {epoch}: {samples} samples in {active:.2f} s = {samples / active:.0f} samples/s, "
                      f"{moved / active:.0f} MB/s; data stall {100 * after['epoch_stall_fraction']:.1f} %; "
                      f"loss {loss_sum / samples:.4f}, accuracy {correct / samples:.2%}", flush=True)
            stats = loader.stats()
            print(f"ferry demo: done. {stats['batches']} batches from {stats['producers_seen']} producer(s), "
                  f"re-issued {stats['reissued']}, invalid messages {stats['invalid_messages']}"
                  + (f", {stats['shared_batches']} handed over in shared memory" if stats["shared_batches"] else ""),
                  flush=True)
        return 0
    except KeyboardInterrupt:
        print("ferry demo: stopped", flush=True)
        return 0
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
