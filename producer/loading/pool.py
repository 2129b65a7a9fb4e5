"""The datasets a producer serves: its own (``--dataset``) and those its consumers name (a pool,
docs/ARCHITECTURE.md#producer; the protocol rule is :mod:`ferry.common.pool`).

Each is a :class:`Served`: the opened dataset, what a HELLO announces of it, the bound on a TASK's indices, and
its own :class:`~ferry.producer.loading.batcher.Batcher` (a batcher learns one dataset's layout), all of them sharing one
sample thread pool (``--threads``) and one buffer pool. One opened dataset per distinct spec and arguments
(:func:`~ferry.common.pool.dataset_key`); a connection is bound to one at a time. A consumer may name a built-in or a
spec the producer was started to allow (``--allow-dataset``); anything else is refused with
:class:`DatasetRefused`, naming the allow-list. At most MAX_NAMED_DATASETS named datasets are open at once: a new
one closes one that no connection is bound to, or is refused.

A named dataset is served as its spec builds it, with the consumer's ``dataset_args``: the producer's
``--transform``, ``--collate`` and ``--init`` belong to its own dataset. Named datasets open one at a time on the
``ferry-open`` thread (a folder scan or a user's factory may take minutes): the main loop goes on serving the
other consumers, and the connection that named it stays GREETING until it is open.

Only the main loop (:mod:`ferry.producer.io.service`) uses a DatasetPool.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from ferry.common.canary import as_wire, canary_indices, checked, code_digest, probe
from ferry.common.constants import DEFAULT_THREADS, MAX_DATASET_LEN, MAX_NAMED_DATASETS
from ferry.common.datasets import BUILTINS, dataset_fingerprint, resolve_dataset
from ferry.common.pool import dataset_key
from ferry.common.shardplan import announced_shard_lengths, is_sharded, shard_names
from ferry.common.streamplan import is_iterable, iterable_fields, iterable_len

from ferry.producer.loading.batcher import Batcher
from ferry.producer.io.buffers import BufferPool
from ferry.producer.loading.samples import loads_concurrently
from ferry.producer.loading.samplepool import SamplePool

__all__ = ["Served", "DatasetPool", "DatasetRefused", "announcement"]


def _open(spec: str, args: dict[str, Any]) -> tuple[Any, tuple[dict[str, Any], int, bool]]:
    """On the ``ferry-open`` thread: the dataset built and what a HELLO will say of it (its fingerprint may read
    every file's size; its canary samples are loaded)."""
    dataset = resolve_dataset(spec, args)
    return dataset, announcement(dataset, spec, args, canaries=True)


class DatasetRefused(Exception):
    """A consumer named a dataset this producer may not or cannot open; the message says why."""


@dataclass
class Served:
    """One opened dataset."""

    key: str  # "" for the producer's own, else dataset_key(spec, args)
    dataset: Any
    batcher: Batcher
    announce: dict[str, Any]  # HELLO's "dataset" field
    index_bound: int  # a TASK index at or above this is out of range (an iterable dataset's: its stream, bounded)
    iterable: bool
    links: int = 0  # connections bound to it


def announcement(dataset: Any, label: str, args: dict[str, Any] | None = None, *,
                 canaries: bool = False) -> tuple[dict[str, Any], int, bool]:
    """What a HELLO says of ``dataset`` (its ``dataset`` field; ``args`` echoed for a named one), the bound on a
    TASK's indices, and whether it is iterable. ``canaries``: a map-style dataset's canary samples are loaded and
    described (:mod:`ferry.common.canary`), for the consumer to check its data against its own."""
    sharded, iterable = is_sharded(dataset), is_iterable(dataset)
    length = (len(shard_names(dataset)) if sharded else (iterable_len(dataset) or 0) if iterable else len(dataset))
    shard_lengths = announced_shard_lengths(dataset) if sharded else None
    probed = canaries and not (sharded or iterable) and checked(dataset)
    announce = {"spec": label, "len": length, "fingerprint": dataset_fingerprint(dataset),
                **({"sharded": True} if sharded else {}),
                **({"shard_lens": shard_lengths} if shard_lengths is not None else {}),
                **(iterable_fields(dataset) if iterable else {}),
                **({"args": dict(args)} if args is not None else {}),
                **({"canary": as_wire(probe(dataset, canary_indices(length)))} if probed else {}),
                **({"code": code} if (code := code_digest(label)) is not None else {})}
    return announce, MAX_DATASET_LEN if iterable else length, iterable


class DatasetPool:
    """The producer's own dataset (None without ``--dataset``) and the named ones, by key.

    Args:
        own: the producer's own dataset, opened by ``serve``; None for a producer that serves only named ones.
        label: the spec its HELLO announces.
        allowed: the specs beyond the built-ins a consumer may name (``--allow-dataset``).
        threads: ``--threads``: the sample pool's threads, shared by every dataset's batcher (None: DEFAULT_THREADS).
            A dataset whose loads must not overlap (a user's class without ``--threads``:
            :func:`~ferry.producer.loading.samples.loads_concurrently`) gets a pool of one thread of its own instead.
        seed_per_sample: ``--seed-per-sample``; True makes every dataset's loads one at a time.
        buffers: the buffer pool's bound.
        make_batcher: builds a batcher for a dataset with its collate function, sharing ``(samples, buffers)``.
        wake: wakes the main loop (the service's waker), called when a named dataset's opening ends.
    """

    def __init__(self, own: Any, *, label: str, allowed: tuple[str, ...], threads: int | None, buffers: int,
                 make_batcher: Callable[..., Batcher], wake: Callable[[], None], own_collate: Any = None,
                 seed_per_sample: bool | None = None, canaries: bool = True) -> None:
        self.allowed = allowed
        self._canaries = canaries  # announce the own dataset's canary samples (not a loader's local producer)
        self._seed_per_sample = seed_per_sample  # True: every dataset's loads one at a time (ferry.common.settings)
        self._make = make_batcher
        self._wake = wake  # wakes the main loop when an opening ends (from the ferry-open thread)
        # named datasets open one at a time off the main loop; key -> (spec, args, future of (dataset, announced))
        self._opener = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-open")
        self._opening: dict[str, tuple[str, dict[str, Any], Future]] = {}
        self._threads = threads
        # --threads loads at once over every dataset that may load concurrently (producer/loading/samplepool.py)
        self._samples = SamplePool(DEFAULT_THREADS if threads is None else threads)
        self.buffers = BufferPool(limit=buffers)
        self.own: Served | None = None
        self._named: dict[str, Served] = {}
        if own is not None:
            self.own = self._served("", own, label, None, own_collate)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(([self.own] if self.own is not None else []) + list(self._named.values()))

    @property
    def pending(self) -> int:
        """Jobs submitted to a batcher and not yet finished, over every dataset."""
        return sum(served.batcher.pending for served in self)

    def request(self, spec: str, args: dict[str, Any]) -> Served | None:
        """The dataset ``spec`` names with ``args``, opened once per distinct pair: the Served if it is open, else
        None while it opens on the ``ferry-open`` thread (:meth:`opened` then reports it, and the waker wakes the
        main loop). A slow factory (a folder of a million files to scan) never stalls the main loop, whose
        heartbeats keep the other consumers' work alive meanwhile.

        Raises:
            DatasetRefused: the spec is neither a built-in nor allowed, or MAX_NAMED_DATASETS are open and bound; the
                message says which, naming the allow-list.
        """
        key = dataset_key(spec, args)
        if key in self._named:
            return self._named[key]
        if key in self._opening:
            return None
        if spec not in BUILTINS and spec not in self.allowed:
            allowed = ", ".join(self.allowed) or "none"
            raise DatasetRefused(f"dataset spec {spec!r} is not allowed here: this producer opens the built-ins "
                                 f"({', '.join(BUILTINS)}) and the specs it was started with --allow-dataset (or "
                                 f"FERRY_ALLOW_DATASET): {allowed}")
        if len(self._named) + len(self._opening) >= MAX_NAMED_DATASETS and not self._evict():
            raise DatasetRefused(f"this producer serves {MAX_NAMED_DATASETS} named datasets already, each to a "
                                 "consumer: start another pool for more")
        future = self._opener.submit(_open, spec, args)
        self._opening[key] = (spec, args, future)
        future.add_done_callback(lambda _: self._wake())
        return None

    def opened(self) -> list[tuple[str, Served | DatasetRefused]]:
        """The datasets whose opening ended since the last call: ``(key, Served)``, or ``(key, DatasetRefused)``
        saying why it failed. Main loop only (each dataset's batcher is made here)."""
        done = []
        for key, (spec, args, future) in list(self._opening.items()):
            if not future.done():
                continue
            del self._opening[key]
            try:
                dataset, announced = future.result()
                served = Served(key, dataset, self._make(dataset, None, self._pools(dataset)), *announced)
            except Exception as exc:  # the consumer's mistake or the data's: refused, never the producer's end
                done.append((key, DatasetRefused(f"dataset {spec!r} with {args!r} failed to open: "
                                                 f"{type(exc).__name__}: {exc}")))
                continue
            self._named[key] = served
            done.append((key, served))
        return done

    def _pools(self, dataset: Any) -> tuple[SamplePool | None, BufferPool]:
        """The sample pool and buffer pool a dataset's batcher uses: the shared ones, but a dataset whose loads must
        not overlap (:func:`~ferry.producer.loading.samples.loads_concurrently`, or ``--seed-per-sample 1``, whose
        seeds are process-wide) gets None, a pool of one thread of its own."""
        concurrent = loads_concurrently(dataset, self._threads) and self._seed_per_sample is not True
        return (self._samples if concurrent else None), self.buffers

    def bind(self, old: Served | None, new: Served | None) -> None:
        """A connection moves from ``old`` to ``new`` (either None: none)."""
        if old is not None:
            old.links -= 1
        if new is not None:
            new.links += 1

    def _served(self, key: str, dataset: Any, label: str, args: dict[str, Any] | None, collate: Any) -> Served:
        announce, bound, iterable = announcement(dataset, label, args, canaries=self._canaries)
        batcher = self._make(dataset, collate, self._pools(dataset))
        return Served(key, dataset, batcher, announce, bound, iterable)

    @property
    def opening(self) -> int:
        """Named datasets being opened now."""
        return len(self._opening)

    def _evict(self) -> bool:
        """Close one named dataset that no connection is bound to; False if every one is bound."""
        for key, served in self._named.items():
            if served.links == 0:
                del self._named[key]
                served.batcher.close()
                return True
        return False

    def close(self) -> None:
        """Stop every batcher, then the shared sample pool: queued work is cancelled, running work waited for. An
        opening in progress is not waited for (the process exits past it: producer/exits.py)."""
        self._opener.shutdown(wait=False, cancel_futures=True)
        for served in list(self):
            served.batcher.close()
        self._samples.shutdown()
