"""What a :class:`ferry.DataLoader`'s options become: the keywords of the :class:`~ferry.consumer.loader.RemoteLoader`
that loads its passes (its *engine*), or the calling process itself (``num_workers=0``).

DataLoader's options keep their meaning (docs/porting.md has the table):

* ``num_workers=N`` → ``local_producers=N``; 0 → the calling process loads (consumer/dataloader/inprocess.py), unless
  an ``endpoint`` (or ``FERRY_ENDPOINT``) says remote producers serve;
* ``worker_init_fn`` → ``producer_init``; ``multiprocessing_context`` → ``mp_context`` (the context object DataLoader
  resolved); ``collate_fn`` → ``collate_fn`` (``default_collate`` and ``default_convert``: Ferry's own collation,
  which gives their batches);
* ``prefetch_factor`` given → ``buffer_batches = prefetch_factor × num_workers`` (DataLoader's bound on batches
  in flight), unless ``buffer_batches`` is given; ``timeout``, ``in_order``, ``pin_memory`` as they are;
* the batches: DataLoader's own samplers, drawn at each ``iter()`` (consumer/dataloader/passes.py) and given to the
  engine whole (``GivenPlans``); an iterable dataset is planned by the engine as DataLoader's workers read it. The
  engine never shards by rank: as DataLoader, a rank's share is its sampler's (``DistributedSampler``).
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate, default_convert

from ferry.common.errors import ConfigError
from ferry.common.variables import ENDPOINT_VARIABLE

from ferry.consumer.options import UNSET, LocalOptions
from ferry.consumer.planning import GivenPlans

__all__ = ["OWN_KEYWORDS", "engine_keywords", "loads_in_process"]

#: ferry.DataLoader's own keyword-only options: RemoteLoader's, less those DataLoader has under a name of its own
#: (``num_workers``, ``worker_init_fn``, ``multiprocessing_context``, ``collate_fn``, ``batch_size`` …) and less
#: the rank sharding (``rank``, ``world_size``: a DataLoader's share is its sampler's) and ``local_producers="auto"``'s
#: bounds (``num_workers`` is a count).
OWN_KEYWORDS = (
    "endpoint", "seed", "buffer_batches", "no_producer_timeout", "dataset_args", "dataset_len", "iterable_streams",
    "device", "device_transform", "on_error", "log_every", "metrics_port", "local", "transport", "curve",
    "producer_threads", "producer_slots", "producer_transform", "shared_memory", "collate_args",
    "producer_transform_args", "producer_ahead", "seed_per_sample", "heartbeat", "liveness", "task_timeout",
    "max_batch_bytes", "max_attempts", "compression", "weight", "curve_secret_key", "curve_authorized_keys",
)


def loads_in_process(loader: Any) -> bool:
    """``num_workers=0`` and no endpoint to bind (given, or ``FERRY_ENDPOINT``): the calling process loads."""
    if loader.num_workers > 0 or loader.ferry_options.get("local") is not None:
        return False
    endpoint = loader.ferry_options.get("endpoint", UNSET)
    if endpoint is UNSET:
        return not os.environ.get(ENDPOINT_VARIABLE, "").strip()
    return not endpoint


def _collate(loader: Any) -> Any:
    """The user's ``collate_fn``, or UNSET for DataLoader's defaults: Ferry's collation gives their batches."""
    return UNSET if loader.collate_fn in (default_collate, default_convert) else loader.collate_fn


def engine_keywords(loader: Any, plans: GivenPlans, seed: int, prefetch_given: bool) -> dict[str, Any]:
    """The keywords of the RemoteLoader that loads ``loader``'s passes with local or remote producers.

    Raises:
        ConfigError: ``local=`` and one of DataLoader's options that set the same thing, with other values.
    """
    options = {name: value for name, value in loader.ferry_options.items()}
    kwargs: dict[str, Any] = {**options, "dataset": loader.dataset, "seed": seed, "rank": 0, "world_size": 1,
                              "timeout": loader.timeout, "in_order": loader.in_order,
                              "pin_memory": True if loader.pin_memory else None}
    if isinstance(loader.dataset, IterableDataset):  # planned by the engine, as DataLoader's workers read it
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_size=None, batch_sampler=plans)
    else:  # unbatched: each item of DataLoader's sampler is one task
        kwargs.update(batch_size=None, sampler=plans)
    local = options.get("local")
    if local is None:
        if loader.num_workers > 0:
            kwargs.update(local_producers=loader.num_workers, mp_context=loader.multiprocessing_context,
                          producer_init=loader.worker_init_fn, collate_fn=_collate(loader))
        else:  # remote producers only: a collate_fn of the user's is refused, naming --collate
            kwargs["collate_fn"] = _collate(loader)
    else:
        kwargs["local"] = _merged_local(loader, local)
    if "buffer_batches" not in options and prefetch_given and loader.num_workers > 0:
        kwargs["buffer_batches"] = max(1, loader.prefetch_factor * loader.num_workers)
    return kwargs


def _merged_local(loader: Any, local: LocalOptions) -> LocalOptions:
    """``local=`` with DataLoader's own options for the same fields (those given): a clash is a ConfigError."""
    import dataclasses

    if loader.num_workers not in (0, local.count):
        raise ConfigError(f"num_workers={loader.num_workers} and local=LocalOptions(count={local.count!r}) both say "
                          f"how many producers: give one of them")
    fields = {"mp_context": loader.multiprocessing_context, "init": loader.worker_init_fn,
              "collate": None if _collate(loader) is UNSET else loader.collate_fn}
    changes = {}
    for field, value in fields.items():
        if value is None:
            continue
        if getattr(local, field) not in (None, value):
            raise ConfigError(f"local=LocalOptions({field}=...) and DataLoader's own option for it both given: give "
                              f"one of them")
        changes[field] = value
    return dataclasses.replace(local, **changes)
