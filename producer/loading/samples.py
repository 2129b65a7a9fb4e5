"""What a loading thread does with one sample: load it (under :func:`ferry.sample_info`), write its arrays into
their row of the batch's destination as soon as it is loaded, and describe a failure, naming the sample's
file where the dataset says which. The :class:`~ferry.producer.loading.batcher.Batcher` runs these on its pools.
"""

from __future__ import annotations

import os
import traceback
from concurrent.futures import Future
from typing import Any

import numpy as np

from ferry.common.constants import REMOTE_MESSAGE_CHARS, REMOTE_TRACEBACK_CHARS
from ferry.common.datasets import Transformed
from ferry.common.remote_errors import exception_classes
from ferry.common.sampleinfo import loading
from ferry.common.shm import populate
from ferry.producer.loading.collate import RowLayout

__all__ = ["load_sample", "load_item", "load_row", "read_row", "written_first", "BatchFailed", "sample_file",
           "error_record", "loads_concurrently"]

# a Job (ferry.producer.loading.batcher) is passed in as ``job``: these functions read its ``seed`` and ``epoch``


#: CPython 3.11's AST constructor keeps a recursion counter that threads compiling at once can upset (gh-106905);
#: it then raises this SystemError for code that is fine. ``np.load`` compiles each .npy header
#: (``ast.literal_eval``), so loading threads do hit it, rarely. A load that does is run once more.
_AST_RACE = "AST constructor recursion depth mismatch"


def _retry_ast_race(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except SystemError as exc:
        if _AST_RACE not in str(exc):
            raise
        return fn(*args)


def loads_concurrently(dataset: Any, threads: int | None) -> bool:
    """Whether the loading threads may call ``dataset[i]`` (or ``read_into``) several at a time. ``threads``, the
    producer's ``--threads``, says yes when given. By default (None) only Ferry's built-in datasets do: a
    user's dataset class is called one sample at a time, as a DataLoader worker calls it, because nothing says
    its ``__getitem__`` is thread-safe (a file handle it seeks in, a library that is not), and a race there
    would not raise: it would load the wrong bytes. A transform around a built-in runs on the loading threads
    either way (docs/datasets.md)."""
    if threads is not None:
        return True
    while isinstance(dataset, Transformed):
        dataset = dataset.dataset
    return type(dataset).__module__.split(".")[0] == "ferry"


def load_sample(dataset: Any, index: int, job: Any) -> Any:
    with loading(job.seed, job.epoch, index, seed_globals=job.seed_globals):
        return _retry_ast_race(dataset.__getitem__, index)


def load_item(dataset: Any, item: int | list[int], job: Any) -> Any:
    """An unbatched loader's sample: ``dataset[item]``, ``item`` an index or the list of indices a sampler
    yielded (as DataLoader passes it); :func:`ferry.sample_info` names the first index of a list."""
    with loading(job.seed, job.epoch, item[0] if isinstance(item, list) else item, seed_globals=job.seed_globals):
        return _retry_ast_race(dataset.__getitem__, item)


def load_row(dataset: Any, index: int, job: Any, layout: RowLayout | None, dests: list[np.ndarray], row: int,
              fresh: bool = False) -> tuple[Any, bool]:
    """On a loading thread: ``dataset[index]``, with its arrays copied into row ``row`` of ``dests`` at once
    when it fits ``layout`` (the per-sample arrays are then garbage as soon as this returns). Returns the
    sample (its arrays replaced by their rows when it fits) and whether it fit. ``fresh``: the rows are
    shared-memory pages this process never wrote; they are populated first (:func:`_populate_row`)."""
    sample = load_sample(dataset, index, job)
    if layout is None:
        return sample, False
    if fresh:
        for dest in dests:
            _populate_row(dest[row])
    written = layout.write(sample, dests, row)
    return (sample, False) if written is None else (written, True)


def read_row(dataset: Any, index: int, out: np.ndarray, job: Any, fresh: bool) -> Any:
    """The fast path's loading thread: ``dataset.read_into(index, out)``, with ``out`` populated first when
    it is fresh shared memory."""
    if fresh:
        _populate_row(out)
    with loading(job.seed, job.epoch, index, seed_globals=job.seed_globals):
        return _retry_ast_race(dataset.read_into, index, out)


def _populate_row(row: np.ndarray) -> None:
    """Fault in one row's shared-memory pages in one call (``shm.populate``) before it is written: one system
    call instead of a page fault per 4 KiB, and on the loading threads, in parallel, not ahead of them."""
    if row.flags.c_contiguous and row.nbytes:
        populate(row.reshape(-1).view(np.uint8))


def written_first(first: Future, layout: RowLayout, dests: list[np.ndarray], fresh: bool) -> Future:
    """``first`` (a loaded sample 0) as if the loading thread had written it into row 0 of ``dests``."""
    sample, _ = first.result()
    if fresh:
        for dest in dests:
            _populate_row(dest[0])
    written = layout.write(sample, dests, 0)
    done: Future = Future()
    done.set_result((sample, False) if written is None else (written, True))
    return done


class BatchFailed(Exception):
    """The batch cannot be sent; ``errors`` are the FAIL's records."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


#: Dataset attributes that may list each sample's file: a path per index, or ImageFolder-like (path, label).
_FILE_ATTRIBUTES = ("paths", "files", "samples", "imgs", "path")


def sample_file(dataset: Any, index: int) -> str | None:
    """The file that sample ``index`` comes from, where the dataset says (None where it does not)."""
    for name in _FILE_ATTRIBUTES:
        entries = getattr(dataset, name, None)
        if entries is None or isinstance(entries, (str, bytes, os.PathLike)):
            continue
        try:
            entry = entries[index]
        except Exception:
            continue
        if isinstance(entry, (tuple, list)) and entry:
            entry = entry[0]
        if isinstance(entry, (str, os.PathLike)):
            return os.fspath(entry)
    return None


def error_record(index: int, exc: BaseException) -> dict[str, Any]:
    """A FAIL's record of sample ``index``: its exception by name (type, class chain for the consumer to rebuild
    the type from, message, traceback), never pickled."""
    return {
        "index": index,
        "exc_type": type(exc).__name__,
        "exc_classes": exception_classes(exc),
        "message": str(exc)[:REMOTE_MESSAGE_CHARS],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-REMOTE_TRACEBACK_CHARS:],
    }
