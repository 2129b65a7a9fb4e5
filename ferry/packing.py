"""``ferry pack``: convert a dataset into packed records or ``.tar`` shards, showing how far it is.

A real dataset takes hours to pack, so :class:`PackProgress` says the samples done, the write rate and the time
left: on a terminal as one line redrawn in place (at most :data:`REDRAW_S` apart), elsewhere (a log file, a
batch job's output) as one line every :data:`STEP_PERCENT` percent.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, TextIO

__all__ = ["PackProgress", "run_pack", "REDRAW_S", "STEP_PERCENT"]

#: Seconds between two redraws of the terminal line, at least. [Unit: second]
REDRAW_S = 0.2
#: Off a terminal, a line each time the done share crosses a multiple of this. [Unit: percent]
STEP_PERCENT = 5


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PackProgress:
    """A ``progress(done, total, bytes_written)`` callback that writes to ``stream``; see the module docstring."""

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = sys.stdout if stream is None else stream
        self._terminal = bool(getattr(self._stream, "isatty", lambda: False)())
        self._clock = clock
        self._started = clock()
        self._shown_at = float("-inf")
        self._step = -1  # the last STEP_PERCENT multiple a line was written for

    def __call__(self, done: int, total: int, written: int) -> None:
        now = self._clock()
        finished = done >= total
        if self._terminal:
            if now - self._shown_at < REDRAW_S and not finished:
                return
            self._shown_at = now
            self._stream.write("\r" + self.line(done, total, written, now).ljust(79) + ("\n" if finished else ""))
        else:
            step = done * 100 // max(total, 1) // STEP_PERCENT
            if step == self._step:
                return
            self._step = step
            self._stream.write(self.line(done, total, written, now) + "\n")
        self._stream.flush()

    def line(self, done: int, total: int, written: int, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        left = elapsed * (total - done) / done if done else float("nan")
        eta = _clock(left) if done else "?"
        return (f"  {done * 100 // max(total, 1):3d}% {done}/{total} samples, {written / elapsed / 1e6:.1f} MB/s, "
                f"{eta} left")


def run_pack(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``ferry pack``: what the parsed ``args`` say; usage errors through ``parser``."""
    from ferry.common.datasets import NpyFolderDataset, parse_dataset_args, resolve_dataset

    wanted = 1 if args.dataset else 2
    if len(args.paths) != wanted:
        parser.error("pack takes OUT with --dataset, else SOURCE OUT (an npy-folder root and an output folder)")
    if args.shuffle is not None and args.format != "tar":
        parser.error("--shuffle applies to --format tar (packed records are read by index, in any order)")
    out = args.paths[-1]
    source = (resolve_dataset(args.dataset, parse_dataset_args(args.dataset_arg)) if args.dataset
              else NpyFolderDataset(args.paths[0]))
    progress = PackProgress()
    if args.format == "tar":
        from ferry.common.datasets.tarpack import pack_tar

        names = pack_tar(source, out, shard_samples=args.shard_samples, shuffle=args.shuffle, progress=progress)
        decoding = source.decoding_args() if callable(getattr(source, "decoding_args", None)) else {}
        serve = "".join(f" --dataset-arg '{key}={_json(value)}'" for key, value in decoding.items())
        print(f"packed {len(source)} samples into {len(names)} .tar shard(s) in {out}; serve it with "
              f"--dataset tar-shards --dataset-arg 'pattern={out}/*.tar'{serve}")
        if names.sorted_by_label:
            print("note: the samples were written sorted by label, so each shard holds one or two classes, and a "
                  "shuffle buffer mixes within a shard only: batches would hold one or two classes. Pack with "
                  "--shuffle SEED to spread every class over the shards.")
        return 0
    from ferry.common.datasets.packed import pack as write_packed

    index = write_packed(source, out, shard_bytes=args.shard_mib << 20, classes=getattr(source, "classes", ()),
                         progress=progress)
    print(f"packed {len(source)} samples of {index['dtype']}{index['shape']} into {len(index['shards'])} "
          f"shard(s) in {out}; serve it with --dataset packed --dataset-arg root={out}")
    return 0


def _json(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
