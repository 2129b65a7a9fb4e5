"""A separate Ray driver for tests/ray_trainer.py: another process, with no loader of its own, that starts producer
actors for the trainer's loader with ``ferry.ray.RayProducers(endpoint=..., dataset=..., curve_key=...,
curve_server_key=...)``, its count following the demand that the producers hear in their consumer's PINGs.

    python -m tests.ray_driver --address HEAD:PORT --endpoint tcp://... --keys DIR --length N --stop FILE --out FILE

It runs until FILE (``--stop``) appears, recording every change of its target count with the time, then closes
the actors and writes what it saw to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import ray

from ferry.ray import RayProducers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(name)s %(levelname)s %(message)s")
    ray.init(address=args.address, log_to_driver=True)
    started = time.monotonic()
    targets: list = []
    with RayProducers(endpoint=args.endpoint, dataset="tests.engine_datasets:SlowPairs",
                      dataset_args={"length": args.length, "delay": 0.05}, producers="auto", producers_min=1,
                      producers_max=2, curve_key=os.path.join(args.keys, "good.key_secret"),
                      curve_server_key=os.path.join(args.keys, "server.key"),
                      producer_options={"threads": 1, "slots": 1, "ahead": 0}) as producers:
        deadline = time.monotonic() + 300
        while not os.path.exists(args.stop) and time.monotonic() < deadline:
            target = producers.stats()["target"]
            if not targets or targets[-1][1] != target:
                targets.append([round(time.monotonic() - started, 3), target])
            time.sleep(0.1)
        names = sorted(producers.actors())
    with open(args.out + ".tmp", "w") as f:
        json.dump({"targets": targets, "names": names, "stopped": os.path.exists(args.stop)}, f)
    os.replace(args.out + ".tmp", args.out)
    ray.shutdown()


if __name__ == "__main__":
    main()
