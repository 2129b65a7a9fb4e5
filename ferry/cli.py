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

In a training script:
  from consumer import RemoteLoader
  with RemoteLoader(endpoint="tcp://*:5555", batch_size=32, shuffle=True) as loader:
      for x, y in loader: ...
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("produce", help="run a producer (the same as python -m producer); see ferry produce --help",
                   add_help=False)
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
    if args.command == "demo":
        from .demo import run

        return run(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
