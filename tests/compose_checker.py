"""A second trainer for the compose test: one epoch from the producers that compose started, compared batch
by batch with torch's DataLoader over the same npy-folder dataset.

    python -m tests.compose_checker ENDPOINT ROOT BATCH_SIZE PRODUCERS

Waits (bounded) until PRODUCERS producers have joined, then prints ``checked N batches from P producers`` (live)
and exits 0 when every batch equals the reference; an AssertionError (exit 1) names the first that differs.
"""

import sys
import time

from ferry import RemoteLoader
from ferry.common.datasets import NpyFolderDataset

from tests.helpers import assert_tree_equal, reference_batches


def main() -> None:
    endpoint, root, batch_size, producers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dataset = NpyFolderDataset(root)
    with RemoteLoader(endpoint=endpoint, batch_size=batch_size, shuffle=True, seed=13, heartbeat=0.2,
                      timeout=60, log_every=None) as loader:
        deadline = time.monotonic() + 60
        while loader.stats()["producers"] < producers:
            assert time.monotonic() < deadline, f"only {loader.stats()['producers']} of {producers} producers came"
            time.sleep(0.05)
        loader.set_epoch(1)
        expected = reference_batches(dataset, batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                                     shuffle=True, seed=13, epoch=1)
        count = 0
        for seq, batch in enumerate(loader):
            assert_tree_equal(batch, expected[seq], f"batch {seq}")
            count += 1
        assert count == len(expected), f"{count} batches, DataLoader has {len(expected)}"
        live = loader.stats()["producers"]
    print(f"checked {count} batches from {live} producers", flush=True)


if __name__ == "__main__":
    main()
