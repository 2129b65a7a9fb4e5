"""RDS files written by real R (``Rscript``), for the rds-folder dataset and the R client's tests.

Value ``p`` (0-based, in R's order) of the file of class ``c``, number ``i`` is ``c * 1e6 + i * 1e4 + p``, so a test
can compute what any sample must hold without R, and any mix-up of files, order or dims shows.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from typing import Any

import numpy as np

from ferry.common.datasets import RdsFolderDataset

from . import needs

__all__ = ["rscript", "write_class_folders", "expected_sample", "run_r", "SlowRdsFolder"]


def rscript() -> str:
    """The path of ``Rscript``; skips (fails under CI=true) where R is not installed."""
    path = shutil.which("Rscript")
    if path is None:
        needs.cannot_run("Rscript is not installed (apt-get install r-base-core)")
    return path


def run_r(code: str, timeout: float = 60) -> str:
    """Run R ``code`` with ``Rscript -e``; its stdout. Raises on a non-zero exit, with R's stderr."""
    done = subprocess.run([rscript(), "--vanilla", "-e", code], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"Rscript failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def write_class_folders(root: str, shape: tuple[int, ...], per_class: int, *, classes: tuple[str, ...] = ("0", "1"),
                        extension: str = ".png", compress: str = "TRUE") -> None:
    """``root/<class>/tile_<i><extension>``: each ``saveRDS(array(values, dim = shape))`` of a plain numeric vector (as
    the seed's script saves ``floor(runif(...))``), gzip-compressed as R does by default (``compress`` is saveRDS's)."""
    n = math.prod(shape)
    lines = [f"root <- '{root}'"]
    for c, name in enumerate(classes):
        lines += [f"dir.create(file.path(root, '{name}'), recursive = TRUE, showWarnings = FALSE)",
                  f"for (i in 0:{per_class - 1}) saveRDS({c} * 1e6 + i * 1e4 + (0:{n - 1}), "
                  f"file.path(root, '{name}', sprintf('tile_%03d{extension}', i)), compress = {compress})"]
    run_r("; ".join(lines))
    assert sorted(os.listdir(root)) == sorted(classes)


def expected_sample(c: int, i: int, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """What sample (class ``c``, file ``i``) must hold: R's ``array(values, dim = shape)``, indexed alike."""
    values = c * 1e6 + i * 1e4 + np.arange(math.prod(shape), dtype=np.float64)
    return values.reshape(shape, order="F").astype(dtype)



class SlowRdsFolder(RdsFolderDataset):
    """``rds-folder`` whose every sample takes ``delay`` seconds more (storage slower than this machine's page cache),
    so that a producer killed mid-epoch is killed with tasks in flight. Same samples, same fingerprint."""

    def __init__(self, root: str, shape: Any, dtype: str = "float32", delay: float = 0.0) -> None:
        super().__init__(root, shape, dtype)
        self.delay = float(delay)

    def read_into(self, index: int, out: np.ndarray) -> int:
        time.sleep(self.delay)
        return super().read_into(index, out)
