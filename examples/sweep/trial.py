"""One trial of a hyperparameter sweep whose trials share one producer pool (docs/deployment.md#one-pool-several-jobs).

Each trial binds its own endpoint and names the dataset it wants; the pool's producers (started without --dataset)
open it once and serve every trial that names it, each in its own DataLoader order, sharing their time by weight:

    python -m ferry.producer --connect tcp://127.0.0.1:5555-5557 --metrics-port 9100 &   # the pool (repeat it)
    python examples/sweep/trial.py --endpoint tcp://127.0.0.1:5555 --lr 0.1 &
    python examples/sweep/trial.py --endpoint tcp://127.0.0.1:5556 --lr 0.03 &
    python examples/sweep/trial.py --endpoint tcp://127.0.0.1:5557 --lr 0.01 --weight 2 &
"""

from __future__ import annotations

import argparse
import time

import torch

from ferry import RemoteLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="this trial's own address, tcp://HOST:PORT")
    parser.add_argument("--lr", type=float, required=True, help="the hyperparameter this trial tries")
    parser.add_argument("--weight", type=float, default=1.0, help="its share of the pool against the other trials'")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--delay", type=float, default=0.001, help="seconds a sample takes to load (stands in for storage)")
    args = parser.parse_args()
    dataset_args = {"length": args.samples, "shape": [16], "delay": args.delay}  # the same for every trial: opened once
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    with RemoteLoader(endpoint=args.endpoint, dataset="synthetic", dataset_args=dataset_args, batch_size=64,
                      shuffle=True, seed=0, weight=args.weight, log_every=None, timeout=120) as loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            began, total, batches = time.monotonic(), 0.0, 0
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, batches = total + loss.item(), batches + 1
            seconds = time.monotonic() - began
            print(f"trial lr={args.lr:g} weight={args.weight:g}: epoch {epoch}: {batches} batches, mean loss "
                  f"{total / batches:.4f}, {batches / seconds:.1f} batches/s", flush=True)
    print(f"trial lr={args.lr:g}: done", flush=True)


if __name__ == "__main__":
    main()
