"""A training script whose batch class is its own (defined in ``__main__``), served by a remote producer started with
``--dataset main_namedtuple_trainer:Samples``, which imports this file as ``main_namedtuple_trainer``: the batch must
come back as this script's class (tests/test_dataloader_port.py). Prints one JSON line."""

import collections
import json
import os
import subprocess
import sys

import torch

Pair = collections.namedtuple("Pair", ["index", "value"])


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Pair:
        return Pair(index, torch.tensor([float(index)]))


if __name__ == "__main__":
    from ferry import RemoteLoader

    endpoint = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    producer = subprocess.Popen([sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset",
                                 "main_namedtuple_trainer:Samples"], env={**os.environ, "PYTHONPATH": here},
                                stderr=subprocess.DEVNULL)
    try:
        with RemoteLoader(dataset=Samples(), batch_size=2, endpoint=endpoint, log_every=None,
                          no_producer_timeout=60) as loader:
            batches = list(loader)
    finally:
        producer.terminate()
        producer.wait(30)
    print(json.dumps({"own": all(type(b) is Pair for b in batches), "indices": [b.index.tolist() for b in batches]}))
