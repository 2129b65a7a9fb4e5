"""Hugging Face Accelerate's ``prepare()`` with a :class:`ferry.DataLoader`: accelerate's batches, Ferry's producers.

``accelerator.prepare(loader)`` rebuilds every DataLoader it is given (``accelerate.data_loader.prepare_data_loader``):
it wraps the sampler in its own ``BatchSamplerShard`` (each process's share of every batch), keeps the sampler's
generator in step across processes, and builds a ``DataLoaderShard`` over a new *torch* ``DataLoader`` of the same
dataset and arguments. Handed a ferry.DataLoader, that trains on torch's workers, not on Ferry's producers, without a
word. So a ferry.DataLoader answers accelerate's own question, ``_is_accelerate_prepared``, read first thing in
``Accelerator.prepare_data_loader`` (:func:`prepared_in_place`): asked there, it lets the accelerator prepare a plain
torch twin of itself (accelerate's whole path, its arguments untouched), keeps Ferry's producers in the
``DataLoaderShard`` that comes back, and answers True: accelerate then hands back the ferry.DataLoader itself, which
iterates through that shard from then on. ``accelerator.prepare(loader)`` thus needs nothing of Ferry's. As a
helper for code that wants the shard itself, :func:`prepare` calls ``accelerator.prepare`` as it is, then replaces
the torch DataLoader inside each
``DataLoaderShard`` that came from a ferry.DataLoader (its ``base_dataloader``, to which the shard hands every
iteration and attribute) with a ferry.DataLoader of the very arguments accelerate gave it (its
``BatchSamplerShard``, its generator, the original's ``num_workers``, ``collate_fn`` …) and the original's Ferry
options. So each process gets exactly the batches accelerate with torch's DataLoader gives it (accelerate's own
sampler decides them, drawn as DataLoader draws), with accelerate's device placement, end-of-data tracking and
``set_epoch``, loaded by Ferry's producers. accelerate is not imported here: the accelerator is the caller's.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch.utils.data
from torch.utils.data import BatchSampler, IterableDataset

from ferry.consumer.dataloader.loader import DataLoader

__all__ = ["prepare", "prepared_in_place"]


def prepare(accelerator: Any, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects, **kwargs)``, with every :class:`ferry.DataLoader` among ``objects`` still
    loaded by Ferry's producers (module docstring). Returns what ``accelerator.prepare`` returns (one object, or a
    tuple in the same order).

    Raises:
        TypeError: accelerate returned a prepared loader of a kind this does not know (no ``base_dataloader``): it
            would load on torch's workers.
    """
    prepared = accelerator.prepare(*objects, **kwargs)
    results = [prepared] if len(objects) == 1 else list(prepared)
    for position, (given, result) in enumerate(zip(objects, results)):
        if isinstance(given, DataLoader) and result is not given:
            results[position] = _keep_producers(result, given)
    return results[0] if len(objects) == 1 else tuple(results)


def _keep_producers(shard: Any, original: DataLoader) -> Any:
    """``shard`` (accelerate's DataLoaderShard) with its torch DataLoader replaced by a ferry.DataLoader of the same
    arguments and ``original``'s Ferry options; the torch DataLoader never started anything (built, not iterated)."""
    base = shard.__dict__.get("base_dataloader")
    if base is None:
        raise TypeError(f"accelerate prepared the ferry.DataLoader as a {type(shard).__name__} without a "
                        f"base_dataloader (dispatch_batches=True?): it would load on torch's workers; prepare() "
                        f"keeps Ferry's producers for accelerate's DataLoaderShard only")
    if isinstance(base, DataLoader):
        return shard
    if isinstance(base.dataset, IterableDataset):
        batching = {"batch_size": base.batch_size, "drop_last": base.drop_last}
    elif type(base.batch_sampler) is BatchSampler:  # accelerate's sampler given as sampler= (a batch sampler itself)
        batching = {"sampler": base.sampler, "batch_size": base.batch_size, "drop_last": base.drop_last}
    elif base.batch_sampler is not None:
        batching = {"batch_sampler": base.batch_sampler}
    else:
        batching = {"sampler": base.sampler, "batch_size": None}
    shard.base_dataloader = DataLoader(
        base.dataset, **batching, num_workers=base.num_workers, collate_fn=base.collate_fn, pin_memory=base.pin_memory,
        timeout=base.timeout, worker_init_fn=base.worker_init_fn, multiprocessing_context=base.multiprocessing_context,
        generator=base.generator, prefetch_factor=base.prefetch_factor if original._prefetch_given else None,
        persistent_workers=base.persistent_workers, pin_memory_device=base.pin_memory_device,
        in_order=base.in_order, **original.ferry_options)
    return shard


def prepared_in_place(loader: DataLoader, caller: Any) -> bool:
    """``loader._is_accelerate_prepared``, as asked from the frame ``caller``. Asked by accelerate's
    ``Accelerator.prepare_data_loader`` for the first time: the accelerator prepares a torch twin of ``loader`` (a
    copy of it as a plain torch DataLoader: every attribute accelerate reads, nothing started), the shard it returns
    gets Ferry's producers (:func:`_keep_producers`) and becomes ``loader``'s, and the answer is True, so that
    accelerate returns ``loader`` itself. Asked by anything else: whether it was prepared so."""
    shard = loader.__dict__.get("_accelerate_shard")
    if shard is not None or not _asked_by_accelerate(caller):
        return shard is not None or bool(loader.__dict__.get("_accelerate_mark"))
    accelerator = caller.f_locals["self"]
    twin = copy.copy(loader)
    twin.__class__ = torch.utils.data.DataLoader  # the same attributes, read by accelerate as a torch DataLoader's
    prepared = accelerator.prepare_data_loader(twin, device_placement=caller.f_locals.get("device_placement"),
                                               slice_fn_for_dispatch=caller.f_locals.get("slice_fn_for_dispatch"))
    if prepared in accelerator._dataloaders:  # the loader itself stands for it (accelerate appends it next)
        accelerator._dataloaders.remove(prepared)
    loader.__dict__["_accelerate_shard"] = _keep_producers(prepared, loader)
    return True


def _asked_by_accelerate(caller: Any) -> bool:
    """Whether ``caller`` is ``Accelerator.prepare_data_loader`` of the accelerate this process imported."""
    accelerate = sys.modules.get("accelerate")
    if accelerate is None or caller is None or caller.f_code.co_name != "prepare_data_loader":
        return False
    if caller.f_globals.get("__name__") != "accelerate.accelerator":
        return False
    return isinstance(caller.f_locals.get("self"), getattr(accelerate, "Accelerator", ()))
