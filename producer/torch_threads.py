"""How many CPU threads torch's operations use in a producer (``--torch-threads``), as DataLoader's workers.

A producer loads ``--threads`` samples at once. If each of those loads ran torch's operations (a transform's
normalize, resize, conversion) on an OpenMP team as large as the machine, the teams would fight over the
cores: on 2 cores, two producers loading images with torch ops served about 90 samples/s with torch's default
against about 500 with one thread each (docs/performance.md). DataLoader calls ``torch.set_num_threads(1)`` in
every worker for the same reason, and so does a producer, by default.

torch keeps one process-wide count, which each thread takes up at its first torch operation. So the count is
set first thing in :func:`ferry.producer.serve`, before the dataset is unpickled or opened and before any loading
thread starts (a process forked from a trainer must not run an operation on the OpenMP pool it inherited): with
``torch.set_num_threads`` when torch is loaded already, else through ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``,
which torch reads when a ``__getitem__`` imports it later. Those variables are the process's own from then on:
libraries loaded later and processes the dataset starts read them too, as they would in a worker that a user
had started with them. A producer process is the dataset's; one embedded with ``serve`` in a process of the
user's sets them there as well (``torch_threads`` in its config says how many).
"""

from __future__ import annotations

import os
import sys

__all__ = ["limit_torch_threads", "THREAD_VARIABLES"]

#: The variables torch reads for its count when it is first imported (the second wins where both are set).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_torch_threads(threads: int | None) -> int | None:
    """Give torch ``threads`` CPU threads per operation in this process; None: one, unless this process's
    environment sets ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` (torch then follows them). Returns the count set,
    or None where the environment decides."""
    if threads is None:
        if any(os.environ.get(name) for name in THREAD_VARIABLES):
            return None
        threads = 1
    set_num_threads = getattr(sys.modules.get("torch"), "set_num_threads", None)
    if set_num_threads is not None:
        set_num_threads(threads)
    else:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(threads)
    return threads
