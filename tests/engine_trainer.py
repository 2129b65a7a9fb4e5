"""The trainer of the engines' real runs: deploy/slurm/ferry.sbatch runs it as its trainer command
(tests/test_slurm.py), docker/swarm-e2e.sh as the Swarm stack's trainer service. One epoch from the job's
producers, compared batch by batch with torch's DataLoader over the same npy-folder dataset, with pauses that the
test or script ends.

    python -m tests.engine_trainer ROOT --control DIR [--batch-size 16] [--producers 2] [--gate 8 [--gate 16]]

It binds what the engine's files give it, as any trainer of theirs would: the endpoint in FERRY_ENDPOINT and the
CURVE keys in FERRY_CURVE_SECRET_KEY and FERRY_CURVE_AUTHORIZED_KEYS, which RemoteLoader reads itself. It waits
(bounded) for ``--producers`` producers, and at each ``--gate`` N (the batches taken so far) keeps writing its
figures to DIR/status.json until DIR/go-N appears (at most ``--gate-timeout`` seconds); after the epoch it writes
DIR/result.json: the batches checked, ``producers_seen`` and the batches each producer (``host:pid``) delivered.
An AssertionError (exit 1) names the first batch that differs from DataLoader's, or what it waited for in vain.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import time

from ferry import RemoteLoader
from ferry.common.datasets import NpyFolderDataset

from tests.helpers import assert_tree_equal, reference_batches

SEED = 13
POLL_S = 0.05


class Figures:
    """The loader's figures as the test reads them: DIR/status.json, rewritten atomically, and the most batches
    each producer was seen to have delivered (``stats()["per_producer"]`` lists live producers only, so a killed
    one keeps the count it had when last seen)."""

    def __init__(self, loader: RemoteLoader, control: str) -> None:
        self.loader, self.control = loader, control
        self.delivered: dict[str, int] = {}

    def write(self, phase: str, batches: int) -> dict:
        stats = self.loader.stats()
        for name, figures in stats["per_producer"].items():
            self.delivered[name] = max(self.delivered.get(name, 0), figures["batches"])
        status = {"phase": phase, "host": socket.gethostname(), "batches": batches, "producers": stats["producers"],
                  "producers_seen": stats["producers_seen"], "reissued": stats["reissued"],
                  "delivered": self.delivered}
        self.dump("status.json", status)
        return status

    def dump(self, name: str, value: dict) -> None:
        path = os.path.join(self.control, name)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--control", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--gate", type=int, action="append", default=[],
                        help="hold the epoch after this many batches until DIR/go-N appears; repeatable")
    parser.add_argument("--gate-timeout", type=float, default=180.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="trainer %(name)s %(levelname)s %(message)s")
    dataset = NpyFolderDataset(args.root)
    with RemoteLoader(batch_size=args.batch_size, shuffle=True, seed=SEED, heartbeat=0.5, no_producer_timeout=120,
                      buffer_batches=4, log_every=None) as loader:  # endpoint and CURVE keys: the job's FERRY_*
        assert loader.curve is not None, "the job's CURVE keys were not taken up"
        print(f"trainer on {socket.gethostname()} bound {', '.join(loader.endpoints)}", flush=True)
        figures = Figures(loader, args.control)
        deadline = time.monotonic() + 120
        while figures.write("waiting", 0)["producers"] < args.producers:
            assert time.monotonic() < deadline, f"only {loader.stats()['producers']} of {args.producers} producers came"
            time.sleep(POLL_S)
        loader.set_epoch(1)
        expected = reference_batches(dataset, batch_size=args.batch_size, drop_last=False, world_size=1, rank=0,
                                     shuffle=True, seed=SEED, epoch=1)
        count = 0
        for seq, batch in enumerate(loader):
            assert_tree_equal(batch, expected[seq], f"batch {seq}")
            count += 1
            figures.write("training", count)
            if count in args.gate:
                wait_for_go(figures, count, args.gate_timeout)
        assert count == len(expected), f"{count} batches, DataLoader has {len(expected)}"
        final = figures.write("done", count)
        figures.dump("result.json", final)
    print(f"checked {count} batches from {final['producers_seen']} producers", flush=True)


def wait_for_go(figures: Figures, count: int, timeout: float) -> None:
    """Hold the epoch at batch ``count`` until the test writes DIR/go-COUNT, writing the figures meanwhile."""
    go = os.path.join(figures.control, f"go-{count}")
    deadline = time.monotonic() + timeout
    while not os.path.exists(go):
        assert time.monotonic() < deadline, f"no {go} within {timeout} s of the pause at batch {count}"
        figures.write("paused", count)
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
