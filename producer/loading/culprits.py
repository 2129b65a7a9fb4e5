"""A batch that does not collate: which of its samples are to blame, and the FAIL records that say so.

When ``collate`` raises, the samples whose structure, shape or dtype differ from the majority's are the
culprits: under ``on_error="skip"`` they are dropped (one error record each) and the rest is collated; else the
FAIL names the first of them and its file, where the dataset lists files. A batch lost whole under skip carries
one record per sample, so the consumer's ``skipped_samples`` counts every sample that did not arrive.
"""

from __future__ import annotations

from typing import Any, Callable

from ferry.producer.loading.collate import CollateError, describe, odd_ones_out, signature
from ferry.producer.loading.samples import BatchFailed, error_record, sample_file

__all__ = ["collate_or_blame", "whole_batch"]


def collate_or_blame(collate_fn: Callable[[list[Any]], Any], dataset: Any, job: Any, samples: list[Any],
                     indices: list[int]) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """``collate_fn(samples)``; when that fails, the odd samples out (those whose structure, shape or dtype
    differs from the others') are named, and under ``skip`` dropped and the rest collated.

    Returns the batch, the samples in it and the error records of the dropped ones.

    Raises:
        BatchFailed: with the records that explain why the batch cannot be sent.
    """
    try:
        return collate_fn(samples), samples, []
    except Exception as exc:
        first_error = exc
    odd, majority = odd_ones_out(samples)
    if not odd:
        raise BatchFailed(whole_batch(job, indices, first_error))
    others = len(samples) - len(odd)
    records = []
    for position in odd:
        index = indices[position]
        where = sample_file(dataset, index)
        problem = CollateError(
            f"sample {index}{f' ({where})' if where else ''} is {describe(signature(samples[position]))}, "
            f"unlike the other {others} of its batch, which are {describe(majority)}: {first_error}")
        records.append(error_record(index, problem))
    if job.on_error != "skip":
        raise BatchFailed(records)
    dropped = set(odd)
    kept = [s for p, s in enumerate(samples) if p not in dropped]
    kept_indices = [i for p, i in enumerate(indices) if p not in dropped]
    try:
        return collate_fn(kept), kept, records
    except Exception as exc:
        raise BatchFailed(records + whole_batch(job, kept_indices, exc))


def whole_batch(job: Any, indices: list[int], exc: BaseException) -> list[dict[str, Any]]:
    """Records for a batch lost as a whole: under skip one per sample, so that the consumer counts every
    sample that did not arrive (only the first with the message and traceback: a FAIL header stays far
    below MAX_HEADER_BYTES for any batch size); else one, naming the first."""
    first = error_record(indices[0], exc)
    if job.on_error == "skip":
        same = f"the whole batch failed: see sample {indices[0]}"
        return [first] + [{"index": i, "exc_type": first["exc_type"], "message": same, "traceback": ""}
                          for i in indices[1:]]
    return [first]
