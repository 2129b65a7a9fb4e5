"""Command line of the producer: ``python -m ferry.producer`` and ``ferry produce``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Mapping

from ferry.common.constants import DEFAULT_SLOTS, DEFAULT_THREADS, HEARTBEAT_S, LIVENESS
from ferry.common.errors import ConfigError

from ferry.producer.config import LOG_LEVELS, UNREACHABLE_WARNING_S, read_env

EXAMPLES = """\
examples:
  # serve .npy files in class folders to a trainer on another host
  python -m ferry.producer --connect tcp://trainer:5555 --dataset npy-folder --dataset-arg root=/data/train

  # serve all 4 ranks of a torchrun job on one host (ports 5555..5558), 8 loader threads
  python -m ferry.producer --connect tcp://trainer:5555-5558 --dataset npy-folder --dataset-arg root=/data --threads 8

  # your own dataset: a class or factory, with keyword arguments (JSON values)
  python -m ferry.producer --connect tcp://127.0.0.1:5555 --dataset mypkg.data:TileDataset \\
      --dataset-arg root=/data --dataset-arg 'bands=[1,2,3]'

  # a synthetic dataset with 5 ms of latency per sample
  python -m ferry.producer --connect tcp://127.0.0.1:5555 --dataset synthetic \\
      --dataset-arg length=10000 --dataset-arg 'shape=[13,299,299]' --dataset-arg delay=0.005

Every flag can also come from the environment: FERRY_CONNECT (comma-separated), FERRY_DATASET,
FERRY_DATASET_ARGS (JSON object), FERRY_TRANSFORM, FERRY_THREADS, FERRY_SLOTS, FERRY_CURVE_KEY,
FERRY_CURVE_SERVER_KEY, FERRY_METRICS_PORT, FERRY_LOG_LEVEL, FERRY_COMPRESSION. A flag wins over its variable; a variable
that does not parse is an error (exit status 2), even with --help.

  # CURVE: encrypted, and only producers whose keys the consumer authorized get work
  python -m ferry.producer --connect tcp://trainer:5555 --dataset synthetic \\
      --curve-key keys/producer.key_secret --curve-server-key keys/server.key
Exit status: 0 after SIGTERM/SIGINT (it says BYE first), 2 on a configuration error,
3 when every consumer rejected it permanently.
"""


def build_parser(prog: str = "python -m ferry.producer", env: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The producer's flags; their defaults come from ``env``, the parsed variables of :func:`read_env`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Ferry producer: read samples of a dataset, collate them into batches, and stream them to "
            "Ferry consumers (RemoteLoader) over ZeroMQ. Consumers decide which samples form each batch; "
            "start as many producers as you like, on any host, in any order."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env = (env or {}).get
    parser.add_argument("--connect", action="append", metavar="ENDPOINT",
                        help="consumer endpoint, tcp://HOST:PORT, tcp://HOST:PORT-PORT (a range of ranks) or "
                             "ipc://PATH; repeat for several consumers [env FERRY_CONNECT]")
    parser.add_argument("--dataset", default=env("FERRY_DATASET"), metavar="SPEC",
                        help="a built-in dataset (synthetic, npy-folder, image-folder, packed) or package.module:callable that "
                             "returns a map-style dataset [env FERRY_DATASET]")
    parser.add_argument("--dataset-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the dataset; VALUE is parsed as JSON when it parses, "
                             "else taken as a string; repeatable [env FERRY_DATASET_ARGS, a JSON object]")
    parser.add_argument("--transform", default=env("FERRY_TRANSFORM"), metavar="CALLABLE",
                        help="package.module:callable applied to every sample before collation, e.g. a crop "
                             "or a normalisation [env FERRY_TRANSFORM]")
    parser.add_argument("--collate", default=env("FERRY_COLLATE"), metavar="CALLABLE",
                        help="package.module:callable that collates a list of samples into a batch, in place of "
                             "default_collate, like DataLoader's collate_fn (e.g. to pad sequences) "
                             "[env FERRY_COLLATE]")
    parser.add_argument("--init", default=env("FERRY_INIT"), metavar="CALLABLE",
                        help="package.module:callable called once in this producer process with its worker id, "
                             "like DataLoader's worker_init_fn [env FERRY_INIT]")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of this process's random, numpy and torch generators (default: drawn from the "
                             "OS, so no two producers share a stream); for reproducible augmentation use "
                             "ferry.sample_info().seed in the dataset instead")
    parser.add_argument("--threads", type=int, default=env("FERRY_THREADS", DEFAULT_THREADS),
                        help=f"loader threads; the samples of a batch load concurrently (default {DEFAULT_THREADS})")
    parser.add_argument("--slots", type=int, default=env("FERRY_SLOTS", DEFAULT_SLOTS),
                        help=f"batches taken at once from each consumer (default {DEFAULT_SLOTS})")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT_S,
                        help=f"seconds between heartbeats before the consumer sets its own (default {HEARTBEAT_S})")
    parser.add_argument("--liveness", type=int, default=LIVENESS,
                        help=f"heartbeats of silence before a consumer counts as gone (default {LIVENESS})")
    parser.add_argument("--curve-key", default=env("FERRY_CURVE_KEY"), metavar="FILE",
                        help="this producer's CURVE key pair (a .key_secret file from ferry keys); enables "
                             "encryption and authentication [env FERRY_CURVE_KEY]")
    parser.add_argument("--curve-server-key", default=env("FERRY_CURVE_SERVER_KEY"), metavar="FILE",
                        help="the consumer's CURVE public key (server.key) [env FERRY_CURVE_SERVER_KEY]")
    parser.add_argument("--metrics-port", type=int, default=env("FERRY_METRICS_PORT") or None,
                        metavar="PORT", help="serve Prometheus metrics on this port (needs ferry[metrics]) "
                                             "[env FERRY_METRICS_PORT]")
    parser.add_argument("--compression", default=env("FERRY_COMPRESSION"), type=str.lower,
                        choices=("auto", "lz4", "zstd", "none"),
                        help="compress batch frames: none, lz4 or zstd override what the consumer's tasks ask for "
                             "(RemoteLoader's compression=, default auto: the consumer decides); auto follows the "
                             "consumer; lz4 needs ferry[lz4], zstd ferry[zstd] [env FERRY_COMPRESSION]")
    parser.add_argument("--log-level", default=env("FERRY_LOG_LEVEL", "INFO"), type=str.upper, choices=LOG_LEVELS,
                        help="log verbosity, in any case (default INFO) [env FERRY_LOG_LEVEL]")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m ferry.producer") -> int:
    from ferry.common.datasets import parse_dataset_args
    from ferry.common.errors import FerryError

    from ferry.producer import ProducerConfig, serve

    try:
        env = read_env()  # before the flags, so that a bad variable is named even with --help
    except ConfigError as exc:
        print(f"ferry producer: error: {exc}", file=sys.stderr)
        return 2
    parser = build_parser(prog, env)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=f"ferry-producer[{os.getpid()}] %(levelname)s %(message)s",
                        stream=sys.stderr)
    endpoints = args.connect or env.get("FERRY_CONNECT")
    if not endpoints:
        parser.error("--connect is required (or set FERRY_CONNECT)")
    if not args.dataset:
        parser.error("--dataset is required (or set FERRY_DATASET)")
    try:
        dataset_args = dict(env.get("FERRY_DATASET_ARGS", {}))
        dataset_args.update(parse_dataset_args(args.dataset_arg))
        curve = None
        if args.curve_key or args.curve_server_key:
            from ferry.common.security import CurveClient

            if not (args.curve_key and args.curve_server_key):
                raise ValueError("CURVE needs both --curve-key and --curve-server-key")
            curve = CurveClient.load(args.curve_key, args.curve_server_key)
        config = ProducerConfig(
            endpoints=tuple(endpoints), dataset=args.dataset, dataset_args=dataset_args, threads=args.threads,
            slots=args.slots, heartbeat=args.heartbeat, liveness=args.liveness,
            exit_with_parent=env.get("FERRY_EXIT_WITH_PARENT", False), curve=curve,
            transform=args.transform, metrics_port=args.metrics_port, shared_memory=env.get("FERRY_SHARED_MEMORY"),
            unreachable_warning_s=env.get("FERRY_UNREACHABLE_WARNING_S", UNREACHABLE_WARNING_S),
            init=args.init, collate=args.collate, seed=args.seed, compression=args.compression,
            worker_id=env.get("FERRY_WORKER", (0, 1))[0], num_workers=env.get("FERRY_WORKER", (0, 1))[1],
        )
        return serve(config)
    except (FerryError, ValueError) as exc:
        print(f"ferry producer: error: {exc}", file=sys.stderr)
        return 2
