"""How many CPU threads torch's operations use in a producer (``--torch-threads``), as DataLoader's workers.

A producer loads ``--threads`` samples at once. If each of those loads ran torch's operations (a transform's
normalize, resize, conversion) on an OpenMP team as large as the machine, the teams would fight over the
cores: on 2 cores, two producers loading images with torch ops served about 70 samples/s with torch's default
against about 400 with one thread each. DataLoader calls ``torch.set_num_threads(1)`` in every worker for the
same reason, and so does a producer, by default.

torch keeps one process-wide count, which each thread takes up at its first torch operation. So the count is
set before any loading thread starts: with ``torch.set_num_threads`` when torch is loaded already (the dataset's
module imported it, or the producer was forked from a trainer), else through ``OMP_NUM_THREADS``, which torch
(and its OpenMP runtime) read when a ``__getitem__`` imports torch later.
"""

from __future__ import annotations

import os
import sys

__all__ = ["limit_torch_threads"]


def limit_torch_threads(threads: int | None) -> int | None:
    """Give torch ``threads`` CPU threads per operation in this process; None: one, unless this process's
    environment sets ``OMP_NUM_THREADS`` (torch then follows it). Returns the count set, or None where the
    environment decides. Call it before the loading threads start."""
    if threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return None
        threads = 1
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads
