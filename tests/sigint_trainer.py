"""A training script that traps SIGINT to finish its epoch and save a checkpoint, a common pattern:
``python -m tests.sigint_trainer object|spec``.

Two local producers (a dataset object, forked; or a spec, started as subprocesses) serve one epoch of 40 batches;
after its fifth batch the script prints "READY" and goes on slowly (20 ms a step), so that a Ctrl-C sent to its
process group lands mid-epoch. Its handler only sets a flag; the epoch runs to its end, then it prints
"CHECKPOINT <batches> <signals>" and exits 0. Any error ends it with a traceback and exit 1.
"""

import signal
import sys
import time

from ferry import RemoteLoader

from tests.lifecycle_datasets import PairDataset

BATCHES = 40


def main() -> None:
    interrupted = []
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    dataset = PairDataset(BATCHES * 2) if sys.argv[1] == "object" else "tests.lifecycle_datasets:PairDataset"
    with RemoteLoader(dataset=dataset, dataset_args=None if sys.argv[1] == "object" else {"length": BATCHES * 2},
                      local_producers=2, batch_size=2, timeout=60, log_every=None) as loader:
        taken = 0
        for _ in loader:
            taken += 1
            if taken == 5:
                print("READY", flush=True)
            if taken >= 5:
                time.sleep(0.02)
        print(f"CHECKPOINT {taken} {len(interrupted)}", flush=True)


if __name__ == "__main__":
    main()
