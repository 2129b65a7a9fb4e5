"""One rank of the torchrun test: each rank binds base_port + LOCAL_RANK and takes its shard.

    torchrun --nproc_per_node 2 tests/torchrun_worker.py BASE_PORT LENGTH OUT_DIR
Each rank writes OUT_DIR/rank<r>.json with the sample indices it received, per epoch.
"""

import json
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ferry import RemoteLoader  # noqa: E402


def main() -> None:
    base_port, out = int(sys.argv[1]), sys.argv[3]  # argv[2], the length, is for the reader
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # no rank, world_size or port offset given: all come from torchrun's environment
    with RemoteLoader(endpoint=f"tcp://127.0.0.1:{base_port}", batch_size=4, shuffle=True, seed=6, heartbeat=0.2,
                      timeout=60) as loader:
        epochs = {}
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs[epoch] = [i for _, y in loader for i in y.tolist()]
        record = {"rank": loader.rank, "world_size": loader.world_size, "endpoints": list(loader.endpoints),
                  "len": len(loader), "epochs": epochs}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)  # the ranks really form one job
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"self": record, "all": gathered}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
