"""Which batches make up an epoch: DistributedSampler's plan over sample indices (:mod:`ferry.common.plan`), the
plan over a sharded dataset's shards (:mod:`ferry.common.shardplan`) or over an iterable dataset's streams
(:mod:`ferry.common.streamplan`), and how many batches that is; and the epoch a user gave their own sampler
(:class:`SamplerEpoch`).

The dataset's length (or shard count) may only be known once the first producer said HELLO; so may a sharded
dataset's shard lengths, from which ``len()`` is computed: the loader does not build a spec's dataset (it may
need files only producers have), so producers announce them (HELLO ``shard_lens``). Every wait for them is
bounded and checks the loader's health through the ``check_health`` callback the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ferry.common.constants import POLL_SLICE_S
from ferry.common.errors import ConfigError
from ferry.common.plan import EpochPlan, GeneratorOrder, build_plan, plan_length
from ferry.common.shardplan import build_shard_plan, is_sharded, shard_lengths
from ferry.common.streamplan import AUTOSCALED, StreamPlan, check_iterable_options, is_iterable, iterable_len

__all__ = ["EpochPlanner", "SamplerEpoch", "GivenPlans"]


class GivenPlans:
    """The batches of each epoch given whole by the loader's owner, in place of a ``sampler`` or ``batch_sampler``:
    :class:`ferry.DataLoader` draws each pass from torch's samplers (consumer/passes.py) and gives its plan here
    before it starts the pass's run (``give``), and the planner takes it as it is (``plan``). Iterable as a batch
    sampler is (its current plan's batches), so that every rule of a loader with a ``batch_sampler`` applies."""

    def __init__(self) -> None:
        self._plan: EpochPlan | None = None

    def give(self, plan: EpochPlan) -> None:
        self._plan = plan

    def plan(self, epoch: int) -> EpochPlan:
        """The plan given for ``epoch``.

        Raises:
            ConfigError: none was given for that epoch (a bug of the owner: each run is given its plan first).
        """
        if self._plan is None or self._plan.epoch != epoch:
            raise ConfigError(f"no plan was given for epoch {epoch}")
        return self._plan

    def __iter__(self) -> Any:
        plan = self._plan
        return iter([] if plan is None else [plan.batch(seq) for seq in range(len(plan))])

    def __len__(self) -> int:
        return 0 if self._plan is None else len(self._plan)


class SamplerEpoch:
    """The epoch a script gave its own sampler, ``sampler.set_epoch(e)``, as torchvision's loop does before each
    epoch (also after ``--resume``), where DataLoader leaves the sampler alone.

    Read from the sampler's ``epoch`` (DistributedSampler's attribute; the batch sampler's, or its ``sampler``'s)
    and counted as given when it differs from the epoch the loader last gave that sampler (initially 0,
    DistributedSampler's own start). A sampler without an ``epoch`` it can read is only given the loader's epoch,
    as before: nothing the script gave it can be seen.
    """

    def __init__(self, sampler: Any, batch_sampler: Any) -> None:
        candidates = (sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
        self._samplers = [s for s in candidates if s is not None and _readable_epoch(s) is not None]
        self._last = {id(s): 0 for s in self._samplers}  # the epoch the loader last gave each

    def given(self) -> int | None:
        """The epoch the script gave a sampler since the loader last did, or None."""
        for sampler in self._samplers:
            epoch = _readable_epoch(sampler)
            if epoch is not None and epoch != self._last[id(sampler)]:
                return epoch
        return None

    def planned(self, epoch: int) -> None:
        """The loader gave its samplers ``epoch`` (``build_plan`` called their ``set_epoch``)."""
        for sampler in self._samplers:
            self._last[id(sampler)] = epoch


def _readable_epoch(sampler: Any) -> int | None:
    epoch = getattr(sampler, "epoch", None)
    if callable(getattr(sampler, "set_epoch", None)) and isinstance(epoch, int) and not isinstance(epoch, bool):
        return epoch
    return None


@dataclass(frozen=True)
class _Iterable:
    length: int | None  # len(dataset); None where it has none


class EpochPlanner:
    """Plans epochs for one loader, from its resolved options and what its io thread learned from producers."""

    def __init__(self, opts: Any, io: Any) -> None:
        self._opts, self._io = opts, io
        #: the len(dataset) of an iterable dataset that len(loader) last read, or None: as DataLoader, a run warns
        #: when more *batches* than that come (its check, which a per-stream tail never trips; a copy that yields
        #: the whole dataset in every stream soon does)
        self.iterable_len_told: int | None = None
        # each shard's samples, once known: a dataset object's ``shard_len``s, or what its producers announced
        self._shard_lengths: list[int] | None = None
        self._counted = False  # a local sharded dataset's shard_len was asked
        self.sampler_epoch = SamplerEpoch(opts.sampler, opts.batch_sampler)
        # shuffle=True with generator=: DataLoader's permutations (the default plan only)
        self._order = GeneratorOrder(opts.generator_state) if opts.generator_state is not None else None

    def build(self, epoch: int, check_health: Callable[[], None]) -> Any:
        """The plan of ``epoch``: an EpochPlan, a ShardPlan for a sharded dataset, a StreamPlan for an iterable one.

        Raises:
            ConfigError: options that do not apply to the dataset's kind (an iterable dataset with ``shuffle``, a
                ``sampler``, a ``batch_sampler`` or ``local_producers="auto"``; a sharded one with a sampler).
        """
        o = self._opts
        iterable = self.iterable(check_health)
        if iterable is not None:
            check_iterable_options(shuffle=o.shuffle, sampler=o.sampler, batch_sampler=o.batch_sampler)
            if o.iterable_streams is None:  # local_producers="auto", with a spec that turned out iterable
                raise ConfigError(AUTOSCALED)
            # unbatched (batch_size=None): each of a stream's samples is a task of its own, as DataLoader's fetcher
            return StreamPlan(epoch, o.iterable_streams, 1 if o.unbatched else o.batch_size, o.drop_last,
                              iterable.length, unbatched=o.unbatched)
        if self.is_sharded(check_health):
            if o.sampler is not None or o.batch_sampler is not None:
                raise ConfigError("a sharded dataset is planned over its shards: sampler and batch_sampler do "
                                  "not apply (use shuffle and seed)")
            if o.unbatched:
                raise ConfigError("batch_size=None (unbatched) is not supported for a sharded dataset: use "
                                  "batch_size=1")
            shard_count = self.dataset_len(check_health)
            if self._shard_lengths is None:  # a spec: the lengths come with the producers' HELLO (common/protocol.py)
                self._shard_lengths = self._io.shard_lengths()
            return build_shard_plan(epoch=epoch, shard_count=shard_count, batch_size=o.batch_size,
                                    shuffle=o.shuffle, seed=o.seed, drop_last=o.drop_last, rank=o.rank,
                                    world_size=o.world_size, lengths=self._shard_lengths)
        given = o.batch_sampler if isinstance(o.batch_sampler, GivenPlans) else o.sampler
        if isinstance(given, GivenPlans):
            return given.plan(epoch)
        dataset_len = None if (o.sampler is not None or o.batch_sampler is not None) else self.dataset_len(check_health)
        order = None
        if self._order is not None and o.shuffle and dataset_len is not None:
            order = self._order.permutation(epoch, dataset_len)
        self.sampler_epoch.planned(epoch)  # build_plan gives it to the samplers first thing
        return build_plan(epoch=epoch, dataset_len=dataset_len, batch_size=o.batch_size, shuffle=o.shuffle,
                          seed=o.seed, drop_last=o.drop_last, rank=o.rank, world_size=o.world_size,
                          sampler=o.sampler, batch_sampler=o.batch_sampler, order=order, unbatched=o.unbatched)

    def length(self, epoch: int, check_health: Callable[[], None]) -> int:
        """Batches per epoch. For a sharded dataset only when it gives ``shard_len``, for an iterable one only with
        ``len(dataset)`` (DataLoader's rule: ``len(dataset)`` in batches), else TypeError."""
        o = self._opts
        if self.iterable(check_health) is not None:
            plan = self.build(epoch, check_health)
            n = len(plan)  # TypeError without len(dataset)
            self.iterable_len_told = plan.length
            return n
        if self.is_sharded(check_health):
            return len(self.build(epoch, check_health))
        if o.batch_sampler is not None:
            return len(o.batch_sampler)
        batch_size = 1 if o.unbatched else o.batch_size  # unbatched: one sample (or sampler item) a task
        if o.sampler is not None:
            n = len(o.sampler)
            return n // batch_size if o.drop_last else -(-n // batch_size)
        return plan_length(self.dataset_len(check_health), world_size=o.world_size, batch_size=batch_size,
                           drop_last=o.drop_last)

    def iterable(self, check_health: Callable[[], None]) -> _Iterable | None:
        """An iterable dataset (with its ``len(dataset)`` where it has one, read now as DataLoader reads it), or None
        for the other kinds: a dataset object says it, a spec's first producer (its HELLO)."""
        o = self._opts
        if o.dataset is not None and not isinstance(o.dataset, str):
            return _Iterable(iterable_len(o.dataset)) if is_iterable(o.dataset) else None
        if o.sampler is None and o.batch_sampler is None:
            self._dataset(check_health)  # wait for the first producer: it says which kind it serves
        elif self._io.wait_dataset(0) is None:
            return None  # a sampler plans indices: a map-style dataset unless a producer said otherwise already
        iterable, length = self._io.iterable()
        return _Iterable(length) if iterable else None

    def is_sharded(self, check_health: Callable[[], None]) -> bool:
        """A local sharded dataset object, or a producer that announced one (its HELLO)."""
        dataset = self._opts.dataset
        if dataset is not None and not isinstance(dataset, str):
            if is_sharded(dataset) and not self._counted:
                self._counted = True  # once: a shard that cannot be counted is logged once, not every epoch
                self._shard_lengths = shard_lengths(dataset)  # None: no shard_len, or one cannot be counted
            return is_sharded(dataset)
        if self._opts.sampler is None and self._opts.batch_sampler is None:
            return self._dataset(check_health)[1]  # wait for the first producer: it says which kind it serves
        known = self._io.wait_dataset(0)
        return known is not None and known[1]

    def dataset_len(self, check_health: Callable[[], None]) -> int:
        """The dataset's length (a sharded dataset's shard count); waits for the first producer, bounded by
        the no-producer timeout (``check_health`` raises NoProducersError past it)."""
        return self._dataset(check_health)[0]

    def _dataset(self, check_health: Callable[[], None]) -> tuple[int, bool]:
        while (known := self._io.wait_dataset(POLL_SLICE_S)) is None:
            check_health()
        return known
