"""``ferry relay``: a RemoteLoader in a process of its own, serving its batches to one local client of any language
(R's is ``clients/r``) over the framing of docs/relay-protocol.md.

The loader takes every RemoteLoader keyword: the usual ones as flags, any as ``--option KEY=VALUE`` (a JSON value,
else a string) or all at once as ``--options JSON``, and objects that JSON cannot say (a sampler, a
``device_transform``) as ``--object KEY=package.module:attribute``. SIGTERM or Ctrl-C stops it: the loader closes
(its local producers with it), and the payload folder and connection file are removed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from typing import Any

__all__ = ["add_arguments", "loader_keywords", "run"]

EPILOG = """\
examples:
  # the seed's R files, 2 local producers, batches of 32 in DistributedSampler's shuffled order:
  ferry relay --connection-file /tmp/relay.conn --dataset rds-folder \\
      --dataset-arg root=/data/tiles --dataset-arg shape=13,299,299 --dataset-arg dtype=uint8 \\
      --local-producers 2 --batch-size 32 --shuffle --seed 0
  # producers on other hosts (python -m ferry.producer --connect tcp://THIS_HOST:5555 ...) feed it:
  ferry relay --connection-file /tmp/relay.conn --endpoint tcp://10.0.0.5:5555 --batch-size 32 --shuffle
  # any RemoteLoader keyword, as JSON:
  ferry relay --connection-file /tmp/relay.conn --dataset synthetic --local-producers 1 \\
      --options '{"batch_size": 8, "drop_last": true, "buffer_batches": 4, "transport": null}'
  # rank 1 of 2 (DistributedSampler's share), a collate_fn found by its import path:
  ferry relay --connection-file /tmp/relay.conn --dataset mypkg.data:Train --local-producers 2 \
      --option rank=1 --option world_size=2 --object collate_fn=mypkg.batching:pad_collate

In R (clients/r/ferry.R):
  source("clients/r/ferry.R")
  loader <- ferry_loader("/tmp/relay.conn")
  while (!is.null(batch <- ferry_next(loader))) { x <- batch[[1]]; y <- batch[[2]] }

The client connects to 127.0.0.1 with the port and token of the connection file, which only this user can read.
The relay listens on the loopback interface only, serves one client at a time, and keeps its place when the
client disconnects: the next client goes on with the batches the last one had not consumed.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    relay = parser.add_argument_group("the relay")
    relay.add_argument("--connection-file", default=None, metavar="PATH",
                       help="write the port, token and payload folder there (mode 0600) for the client; default: "
                            "connection in the relay's private folder, printed at start")
    relay.add_argument("--port", type=int, default=0, help="TCP port on the loopback interface (default: a free one)")
    relay.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "::1", "localhost"),
                       help="the loopback address to listen on (never another interface)")
    relay.add_argument("--window", type=int, default=None,
                       help="batches sent ahead of what the client consumed, unless its hello says (at most "
                            "--buffer-batches; default 2)")
    relay.add_argument("--no-payload-files", action="store_true",
                       help="send every batch over the socket, never in payload files")
    loader = parser.add_argument_group("the loader (RemoteLoader's keywords)")
    loader.add_argument("--dataset", default=None, metavar="SPEC", help="dataset spec (built-in or module:callable)")
    loader.add_argument("--dataset-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of --dataset (JSON when it parses); repeatable")
    loader.add_argument("--local-producers", default=None, metavar="N",
                        help="start N producers on this machine (or auto)")
    loader.add_argument("--endpoint", action="append", default=None, metavar="ENDPOINT",
                        help="where remote producers connect (tcp://HOST:PORT); repeatable")
    loader.add_argument("--batch-size", type=int, default=None)
    loader.add_argument("--shuffle", action="store_true", default=None)
    loader.add_argument("--seed", type=int, default=None)
    loader.add_argument("--drop-last", action="store_true", default=None)
    loader.add_argument("--buffer-batches", type=int, default=None)
    loader.add_argument("--options", default=None, metavar="JSON", help="RemoteLoader keywords as a JSON object")
    loader.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="one RemoteLoader keyword (a JSON value, else a string); repeatable")
    loader.add_argument("--object", action="append", default=[], metavar="KEY=package.module:attribute",
                        help="a RemoteLoader keyword whose value is a Python object found by its import path (a "
                             "sampler, a device_transform); repeatable")


def loader_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The RemoteLoader keywords the parsed ``args`` say; later ways win over earlier ones: --options, the flags,
    --option, --object.

    Raises:
        ValueError: --options is not a JSON object, or an --option or --object is not KEY=VALUE.
    """
    from ferry.common.datasets import parse_dataset_args
    from ferry.common.kinds import parse_keyword_args

    keywords: dict[str, Any] = {}
    if args.options:
        given = json.loads(args.options)
        if not isinstance(given, dict):
            raise ValueError(f"--options must be a JSON object of RemoteLoader keywords, got {args.options!r}")
        keywords.update(given)
    flags = {"dataset": args.dataset, "endpoint": args.endpoint, "batch_size": args.batch_size,
             "shuffle": args.shuffle, "seed": args.seed, "drop_last": args.drop_last,
             "buffer_batches": args.buffer_batches}
    keywords.update({key: value for key, value in flags.items() if value is not None})
    if args.local_producers is not None:
        count = args.local_producers
        keywords["local_producers"] = count if count == "auto" else int(count)
    if args.dataset_arg:
        keywords["dataset_args"] = {**keywords.get("dataset_args", {}), **parse_dataset_args(args.dataset_arg)}
    keywords.update(parse_keyword_args(args.option, "--option"))
    for pair in args.object:
        key, sep, spec = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--object {pair!r} must look like KEY=package.module:attribute")
        keywords[key] = _find(spec, f"--object {key}")
    return keywords


def _find(spec: str, what: str) -> Any:
    """``package.module:attribute`` -> the object (``attribute`` may be dotted).

    Raises:
        ValueError: not that shape, or the module or attribute is missing.
    """
    module_name, sep, path = spec.partition(":")
    if not sep or not module_name or not path:
        raise ValueError(f"{what} {spec!r} must look like package.module:attribute")
    try:
        found: Any = importlib.import_module(module_name)
        for part in path.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {spec!r}: {exc}") from None
    return found


def run(args: argparse.Namespace) -> int:
    """``ferry relay``: build the loader, serve until SIGTERM or Ctrl-C."""
    from ferry import RemoteLoader
    from ferry.common.constants import RELAY_DEFAULT_WINDOW
    from ferry.consumer.relay import Relay

    keywords = loader_keywords(args)
    loader = RemoteLoader(**keywords)
    try:
        relay = Relay(loader, host=args.host, port=args.port, connection_file=args.connection_file,
                      window=args.window or RELAY_DEFAULT_WINDOW, payload_files=not args.no_payload_files)
    except BaseException:
        loader.close()
        raise
    for signum in (signal.SIGTERM, signal.SIGINT):  # this process is the relay's own: its signals are ours
        signal.signal(signum, lambda *_: relay.stop())
    print(f"ferry relay: serving on {relay.host}:{relay.port}; connection file {relay.connection_file}", flush=True)
    relay.run()
    print("ferry relay: stopped", file=sys.stderr, flush=True)
    return 0
