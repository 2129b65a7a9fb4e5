"""A training process for the pool test across namespaces: one RemoteLoader naming its dataset, each epoch compared
batch by batch with torch's DataLoader (same shuffle, seed and epoch).

    python -m tests.pool_trainer ENDPOINT SPEC ARGS_JSON BATCH_SIZE SEED EPOCHS WEIGHT
Writes {"epoch", "batch", "producers"} per batch and {"end": epoch, "reissued"} per epoch; exits 0 when every epoch
was DataLoader's, 1 (with the difference on stderr) when one was not.
"""

import json
import sys

from ferry import RemoteLoader
from ferry.common.datasets import resolve_dataset
from tests.helpers import assert_epoch_matches


def main() -> None:
    endpoint, spec, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    batch_size, seed, epochs, weight = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    dataset = resolve_dataset(spec, args)
    with RemoteLoader(endpoint=endpoint, dataset=spec, dataset_args=args, batch_size=batch_size, shuffle=True,
                      seed=seed, weight=weight, heartbeat=0.2, timeout=60, log_every=None) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            assert_epoch_matches(loader, dataset, epoch=epoch, batch_size=batch_size, seed=seed,
                                 each=lambda seq, epoch=epoch: print(json.dumps(
                                     {"epoch": epoch, "batch": seq, "producers": loader.stats()["producers"]}),
                                     flush=True))
            print(json.dumps({"end": epoch, "reissued": loader.stats()["reissued"]}), flush=True)


if __name__ == "__main__":
    main()
