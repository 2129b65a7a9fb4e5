"""Train an AlexNet-style CNN on 13-channel tiles served by Ferry producers.

Start producers first (or after; order does not matter), on this host or any other:

    python -m ferry.producer --connect tcp://127.0.0.1:5555 --dataset npy-folder --dataset-arg root=/data/satellite

then train:

    python examples/satellite/train.py --endpoint 'tcp://*:5555' --epochs 3 --device cuda

The first convolution takes 13 bands and trains; the other feature layers are frozen, and the classifier
(ending in 1 output, trained with BCE) trains. This is the shape of transfer learning, but no pretrained
weights are downloaded: the frozen layers keep their random initialisation, which is enough to show the
data path (load your own weights into `features` for real transfer learning).

Data stall is measured by the loader itself: `loader.stats()` times how long each `next()` waited for data.
Wall-clock stamps around the loop would mix the model step with loading; `stats()` keeps them apart.
"""

import argparse
import time

import torch
from torch import nn

from ferry import RemoteLoader


def alexnet13(width: float = 1.0) -> nn.Module:
    c = [max(4, int(n * width)) for n in (64, 192, 384, 256, 256)]
    features = nn.Sequential(
        nn.Conv2d(13, c[0], 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(c[0], c[1], 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(c[1], c[2], 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(c[2], c[3], 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(c[3], c[4], 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
    )
    hidden = max(16, int(4096 * width))
    model = nn.Sequential(
        features, nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(),
        nn.Dropout(), nn.Linear(c[4] * 36, hidden), nn.ReLU(inplace=True),
        nn.Dropout(), nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 1),
    )
    for layer in list(features)[1:]:  # freeze the feature layers after the first conv
        for p in layer.parameters():
            p.requires_grad_(False)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default="tcp://*:5555", help="where producers connect (default tcp://*:5555)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--width", type=float, default=1.0, help="scale the network's channels (tests use 0.125)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for producers")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = alexnet13(args.width).to(device)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    scale = torch.tensor(1 / 255, device=device)

    def to_float(batch):  # uint8 crosses the network and the bus; float is made on the device
        x, y = batch
        return (x.float() * scale - 0.5) / 0.25, y.float()

    with RemoteLoader(endpoint=args.endpoint, batch_size=args.batch_size, shuffle=True, drop_last=True,
                      device=device if device.type == "cuda" else None, device_transform=to_float,
                      no_producer_timeout=args.timeout) as loader:
        print(f"{len(loader)} batches of {args.batch_size} per epoch; waiting for producers at {args.endpoint}",
              flush=True)
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            before = loader.stats()
            correct = seen = 0
            started = time.monotonic()
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                logits = model(x).squeeze(1)
                loss = loss_fn(logits, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                correct += int(((logits > 0).float() == y).sum())
                seen += len(y)
            after = loader.stats()
            active = after["active_s"] - before["active_s"]
            print(f"epoch {epoch}: {seen} samples, {seen / active:.0f} samples/s, "
                  f"{(after['bytes'] - before['bytes']) / 1e6 / active:.0f} MB/s, "
                  f"data stall {100 * after['epoch_stall_fraction']:.1f} %, accuracy {correct / max(1, seen):.1%}, "
                  f"wall {time.monotonic() - started:.1f} s", flush=True)
            if after["epoch_stall_fraction"] > 0.10:
                print(f"  {loader.diagnosis()}", flush=True)


if __name__ == "__main__":
    main()
