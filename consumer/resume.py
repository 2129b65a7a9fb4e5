"""A loader's resume point: what ``state_dict()`` saves and ``load_state_dict()`` checks and restores.

The state is small and JSON-serialisable: the epoch, how many of its batches the training loop got (for a
sharded dataset also the shard position and the batch within that shard; for an iterable dataset how many of
each stream's batches, ``stream_batches``), and the options that must be the same for the remainder to be
exactly the one the first process would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ferry.common.errors import ConfigError

__all__ = ["RESUME_OPTIONS", "ResumePoint", "capture_state", "restore_state", "check_dataset_len"]

#: Options a state must have been saved with, to be resumed by this loader (``in_order`` is saved too).
MUST_MATCH = ("seed", "shuffle", "drop_last", "batch_size", "rank", "world_size")
RESUME_OPTIONS = (*MUST_MATCH, "in_order")


@dataclass(frozen=True)
class ResumePoint:
    epoch: int
    delivered: int  # batches of ``epoch`` the training loop got
    shard: tuple[int, int]  # a sharded dataset's (shard position, batch within the shard) to go on from
    streams: tuple[int, ...] = ()  # an iterable dataset's batches of each stream delivered (() : none, or not one)
    dataset_len: int | None = None  # of the dataset the state was saved over (shards for a sharded one), if known


def capture_state(point: ResumePoint, options: Mapping[str, Any], samplers: Mapping[str, Any],
                  dataset_len: int | None = None) -> dict[str, Any]:
    """The state of a loader at ``point`` with ``options``; a sampler's own state where it has one; the length of
    its dataset (shards for a sharded one) where the loader knows it."""
    state = {
        "epoch": point.epoch, "batches_delivered": point.delivered,
        **({"dataset_len": dataset_len} if dataset_len is not None else {}),
        **{key: options[key] for key in RESUME_OPTIONS},
        "shard_position": point.shard[0], "shard_batch": point.shard[1],
        **({"stream_batches": list(point.streams)} if point.streams else {}),
    }
    for name, obj in samplers.items():
        if obj is not None and callable(getattr(obj, "state_dict", None)):
            state[name] = obj.state_dict()
    return state


def restore_state(state: Mapping[str, Any], options: Mapping[str, Any], samplers: Mapping[str, Any]) -> ResumePoint:
    """Check ``state`` against this loader's ``options``, restore the samplers' states, return the point.

    Raises:
        ConfigError: the state was saved with other options, or with ``in_order=False`` (not exact); its
            ``stream_batches`` are not batch counts.
    """
    for key in MUST_MATCH:
        if key in state and state[key] != options[key]:
            raise ConfigError(f"state was saved with {key}={state[key]!r}, this loader has {options[key]!r}: "
                              + _mismatch_advice(key, state))
    if not state.get("in_order", True):
        raise ConfigError("a state saved with in_order=False cannot be resumed exactly")
    for name, obj in samplers.items():
        if name in state and callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(state[name])
    streams = state.get("stream_batches", [])
    if not (isinstance(streams, (list, tuple)) and all(isinstance(k, int) and k >= 0 for k in streams)):
        raise ConfigError(f"state's stream_batches must be a list of batch counts, got {streams!r}")
    dataset_len = state.get("dataset_len")
    if dataset_len is not None and not (isinstance(dataset_len, int) and dataset_len >= 0):
        raise ConfigError(f"state's dataset_len must be a number of samples, got {dataset_len!r}")
    return ResumePoint(int(state["epoch"]), int(state["batches_delivered"]),
                       (int(state.get("shard_position", 0)), int(state.get("shard_batch", 0))), tuple(streams),
                       dataset_len)


def _mismatch_advice(key: str, state: Mapping[str, Any]) -> str:
    """What to do about a state saved with another ``key``."""
    afresh = f"start epoch {int(state.get('epoch', 0)) + 1} afresh with set_epoch({int(state.get('epoch', 0)) + 1})"
    if key == "rank":
        return ("under DDP each rank saves its own loader.state_dict() and loads it back (a checkpoint of one "
                f"rank's alone cannot resume another rank's loader); or {afresh} instead of load_state_dict")
    if key == "world_size":
        return ("the saved position is within one rank's share of the epoch, which another world size splits "
                f"otherwise: resume with world_size={state[key]!r}, or {afresh} instead of load_state_dict")
    return f"resume with {key}={state[key]!r}, or {afresh} instead of load_state_dict"


def check_dataset_len(point: ResumePoint, known: int | None) -> None:
    """Raise if ``point`` was saved over a dataset of another length than this loader's (``known``; None: not
    known, as with a sampler that needs none): the rest of its epoch would be another order.

    Raises:
        ConfigError: naming both lengths.
    """
    if point.dataset_len is not None and known is not None and known != point.dataset_len:
        raise ConfigError(f"state was saved over a dataset of {point.dataset_len} samples (shards, for a sharded "
                          f"one), this loader's has {known}: the rest of epoch {point.epoch} would be another order. "
                          f"Resume over the same dataset, or start the epoch afresh with set_epoch({point.epoch + 1})")
