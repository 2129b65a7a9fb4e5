"""``ferry``: the command line. Subcommands import only what they need."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Ferry: distributed data loading for PyTorch. Producers read and collate batches on any machine and
stream them over ZeroMQ to RemoteLoader, a bounded, staged iterator inside your training script."""

EPILOG = """\
subcommand examples:
  ferry demo                                    # synthetic 13-channel data, 2 local producers, 1 epoch
  ferry demo --epochs 2 --producers 3 --samples 1024
  ferry produce --connect tcp://10.0.0.5:5555 --dataset npy-folder --dataset-arg root=/data
  ferry produce --help                          # every producer flag, with examples
  ferry keys ./keys                             # CURVE keys: server + one authorized producer
  ferry pack /data/train /data/train-packed     # fixed-size records: one read per sample
  ferry pack --format tar /data/train /data/train-tar   # WebDataset .tar shards (--dataset tar-shards)
  ferry top http://producer-1:9100 http://producer-2:9100   # a pool's jobs: share, demand, stall
  ferry relay --connection-file /tmp/relay.conn --dataset synthetic --local-producers 2   # batches for R & co

In a training script:
  from ferry import RemoteLoader
  # bind a private address: without CURVE, anyone who reaches the port can join
  with RemoteLoader(endpoint="tcp://10.0.0.5:5555", batch_size=32, shuffle=True) as loader:
      for x, y in loader: ...
"""


KEYS_EPILOG = """\
example:
  ferry keys /etc/ferry/keys --producer host-a --producer host-b
  # trainer:  RemoteLoader(..., curve_secret_key="/etc/ferry/keys/server.key_secret",
  #                        curve_authorized_keys="/etc/ferry/keys/authorized")
  # host-a:   python -m ferry.producer ... --curve-key host-a.key_secret --curve-server-key server.key
Copy each producer's .key_secret to its host only; the server's .key (public) goes to every producer.
To authorize another producer later, drop its .key file into the authorized folder; the trainer reads
the folder again at the next handshake, no restart needed.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("produce", help="run a producer (the same as python -m ferry.producer); see ferry produce --help",
                   add_help=False)
    keys = sub.add_parser("keys", help="generate CURVE key pairs for a consumer and its producers",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=KEYS_EPILOG)
    keys.add_argument("directory", help="folder for the keys (created if missing)")
    keys.add_argument("--producer", action="append", default=None, metavar="NAME",
                      help="producer key pair to create and authorize; repeatable (default: one named 'producer')")
    pack = sub.add_parser("pack", help="convert a dataset into packed shards (one read per sample) or .tar shards; "
                                       "shows its progress",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="examples:\n  ferry pack /data/train /data/train-packed\n"
                                 "  python -m ferry.producer --connect tcp://10.0.0.5:5555 --dataset packed "
                                 "--dataset-arg root=/data/train-packed\n"
                                 "  ferry pack --format tar --dataset mypkg.data:Train --dataset-arg split=train "
                                 "/data/train-tar\n"
                                 "  ferry pack --format tar --shuffle 0 --dataset image-folder --dataset-arg "
                                 "root=/data/photos /data/photos-tar\n"
                                 "  python -m ferry.producer --connect tcp://10.0.0.5:5555 --dataset tar-shards "
                                 "--dataset-arg 'pattern=/data/train-tar/*.tar'")
    pack.add_argument("paths", nargs="+", metavar="[SOURCE] OUT",
                      help="the npy-folder root (class subfolders of .npy files) and the output folder; with "
                           "--dataset, only the output folder")
    pack.add_argument("--format", choices=("packed", "tar"), default="packed",
                      help="packed: fixed-size records and index.json (--dataset packed); tar: WebDataset .tar "
                           "shards, <index>.npy + <index>.cls, images as their files hold them (.png, .jpg ...), "
                           "and shardindex.json (--dataset tar-shards). Default packed")
    pack.add_argument("--dataset", default=None, metavar="SPEC",
                      help="pack any map-style dataset spec (built-in name or package.module:callable) instead "
                           "of an npy-folder")
    pack.add_argument("--dataset-arg", action="append", default=[], metavar="KEY=VALUE",
                      help="a keyword argument of --dataset (JSON when it parses); repeatable")
    pack.add_argument("--shard-mib", type=int, default=1024, help="packed shard size in MiB (default 1024)")
    pack.add_argument("--shard-samples", type=int, default=1000,
                      help="samples per .tar shard, with --format tar (default 1000)")
    pack.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                      help="with --format tar, write the samples in a random order drawn from SEED: a shuffle "
                           "buffer mixes within a shard only, so shards of a class-sorted source (a folder of class "
                           "folders) must be shuffled here. Default: the dataset's order")
    from ferry.demo import add_arguments

    demo = sub.add_parser("demo", help="generate a small 13-channel dataset, start 2 local producers and "
                                       "train a small CNN on the CPU; prints throughput and stall %%",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="example:\n  ferry demo --samples 2048 --producers 3 --epochs 2")
    add_arguments(demo)
    from ferry.top import add_arguments as top_arguments

    top = sub.add_parser("top", help="the jobs a producer pool serves, from its producers' metrics endpoints: each "
                                     "job's weight, share, batches/s, demand and stall, refreshed in the terminal",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="example:\n  ferry top http://producer-1:9100 http://producer-2:9100 --interval 5")
    top_arguments(top)
    from ferry.relaying import EPILOG as RELAY_EPILOG, add_arguments as relay_arguments

    relay = sub.add_parser("relay", help="run a loader in a process of its own and hand its batches to one local "
                                         "client of any language (R: clients/r) over docs/relay-protocol.md",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RELAY_EPILOG)
    relay_arguments(relay)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "produce":  # pass every flag through, untouched
        from ferry.producer.cli import main as produce

        return produce(argv[1:], prog="ferry produce")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except (ValueError, OSError) as exc:  # configuration and data errors: one line, no traceback
        print(f"ferry {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "pack":
        from ferry.packing import run_pack

        return run_pack(parser, args)
    if args.command == "keys":
        from ferry.common.security import generate_keys

        for what, where in generate_keys(args.directory, args.producer or ["producer"]).items():
            print(f"{what}: {where}")
        return 0
    if args.command == "demo":
        from ferry.demo import run

        return run(args)
    if args.command == "top":
        from ferry.top import run as top

        return top(args)
    if args.command == "relay":
        from ferry.relaying import run as relay

        return relay(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
