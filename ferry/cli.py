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
  ferry produce --connect tcp://trainer:5555 --dataset npy-folder --dataset-arg root=/data
  ferry produce --help                          # every producer flag, with examples
  ferry keys ./keys                             # CURVE keys: server + one authorized producer

In a training script:
  from consumer import RemoteLoader
  with RemoteLoader(endpoint="tcp://*:5555", batch_size=32, shuffle=True) as loader:
      for x, y in loader: ...
"""


KEYS_EPILOG = """\
example:
  ferry keys /etc/ferry/keys --producer host-a --producer host-b
  # trainer:  RemoteLoader(..., curve_secret_key="/etc/ferry/keys/server.key_secret",
  #                        curve_authorized_keys="/etc/ferry/keys/authorized")
  # host-a:   python -m producer ... --curve-key host-a.key_secret --curve-server-key server.key
Copy each producer's .key_secret to its host only; the server's .key (public) goes to every producer.
To authorize another producer later, drop its .key file into the authorized folder; the trainer reads
the folder again at the next handshake, no restart needed.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("produce", help="run a producer (the same as python -m producer); see ferry produce --help",
                   add_help=False)
    keys = sub.add_parser("keys", help="generate CURVE key pairs for a consumer and its producers",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=KEYS_EPILOG)
    keys.add_argument("directory", help="folder for the keys (created if missing)")
    keys.add_argument("--producer", action="append", default=None, metavar="NAME",
                      help="producer key pair to create and authorize; repeatable (default: one named 'producer')")
    from .demo import add_arguments

    demo = sub.add_parser("demo", help="generate a small 13-channel dataset, start 2 local producers and "
                                       "train a small CNN on the CPU; prints throughput and stall %%",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="example:\n  ferry demo --samples 2048 --producers 3 --epochs 2")
    add_arguments(demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "produce":  # pass every flag through, untouched
        from producer.cli import main as produce

        return produce(argv[1:], prog="ferry produce")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "keys":
        from common.security import generate_keys

        for what, where in generate_keys(args.directory, args.producer or ["producer"]).items():
            print(f"{what}: {where}")
        return 0
    if args.command == "demo":
        from .demo import run

        return run(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
