"""What a producer's answer to a task may hold: the decoding and checks of BATCH and FAIL. No sockets here.

* A BATCH must answer its task's seq in the current epoch, decode within ``max_batch_bytes``, hold exactly
  the samples the task asked for (less the ones it reports failed), and have the structure and dtypes of
  the first batch accepted. Values cannot be checked; a peer that must not be trusted with them must not
  be let in (CURVE).
* A FAIL is one frame naming at least one sample error.

A breach raises :class:`~ferry.common.errors.ProtocolError`; the io thread decides what it costs the peer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from ferry.common.codec import decode_tree, tree_nbytes, tree_signature
from ferry.common.errors import ProtocolError, RemoteSampleError
from ferry.common.shm import SlotLedger

from ferry.consumer.buffer import Delivery
from ferry.consumer.dispatcher import Task
from ferry.consumer.figures.counters import Counters

log = logging.getLogger("ferry.consumer")

#: Skipped samples logged one by one, from the start; the rest are only counted.
SKIPS_LOGGED = 10


@dataclass(frozen=True)
class Batch:
    tree: Any  # views of the frames (and of the task's shared-memory slot, if it had one)
    nbytes: int
    shared: bool  # some of it came through shared memory
    compressed_bytes: int = 0  # wire bytes of its compressed frames
    uncompressed_bytes: int = 0  # what those frames hold once decompressed


class BatchDecoder:
    """Decodes and checks BATCH results. Remembers the structure of the first batch it accepted."""

    def __init__(self, max_batch_bytes: int) -> None:
        self.max_batch_bytes = max_batch_bytes
        self._signature: Any = None  # structure and dtypes of the first accepted batch

    def decode(self, header: dict[str, Any], frames: list[Any], task: Task, *, epoch: int, indices: Sequence[int],
               ledger: SlotLedger) -> Batch:
        """The batch answering ``task`` (of ``epoch``, asking for ``indices``). Its slot in ``ledger``, if it
        has one, is free again once the batch is dropped."""
        if (header["epoch"], header["seq"]) != (epoch, task.seq):
            raise ProtocolError(f"BATCH for task {header['task']} names seq {header['seq']}, expected {task.seq}")
        region = ledger.take_region(task.task)
        shared = region is not None
        compressed = [0, 0]  # wire and raw bytes of compressed frames
        tree = decode_tree(header["tree"], [f.buffer for f in frames], max_bytes=self.max_batch_bytes,
                           region=region, compressed=compressed)
        del region
        self._check_structure(task, tree, indices, header["errors"])
        nbytes = tree_nbytes(tree)
        return Batch(tree, nbytes, shared and nbytes > sum(len(f) for f in frames), *compressed)

    def _check_structure(self, task: Task, tree: Any, indices: Sequence[int], errors: list[dict[str, Any]]) -> None:
        if errors:
            asked = set(indices)
            stray = next((e["index"] for e in errors if e["index"] not in asked), None)
            if stray is not None:
                raise ProtocolError(f"BATCH reports sample {stray} failed, which task {task.task} did not ask for")
        signature = tree_signature(tree, len(indices) - len(errors))
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            raise ProtocolError("BATCH structure or dtypes differ from the first batch of this dataset")


def check_fail(header: dict[str, Any], frames: list[Any]) -> None:
    if frames or not header["errors"]:
        raise ProtocolError("FAIL must be one frame naming at least one error")


def fail_delivery(header: dict[str, Any], task: Task, producer: str, *, epoch: int, on_error: str,
                  counters: Counters) -> Delivery:
    """What a FAIL hands on: under ``on_error="skip"`` a skipped seq (the samples counted), else its first
    sample error, to be raised in the training loop."""
    if on_error == "skip":
        count_skips(counters, producer, header["errors"])
        return Delivery(run=task.run, seq=task.seq, skipped=True)
    first = header["errors"][0]
    error = RemoteSampleError(index=first["index"], producer=producer, exc_type=first["exc_type"],
                              message=first["message"], traceback=first["traceback"], epoch=epoch, seq=task.seq)
    return Delivery(run=task.run, seq=task.seq, error=error)


def count_skips(counters: Counters, producer: str, errors: list[dict[str, Any]]) -> None:
    """Samples skipped under ``on_error="skip"``: counted, and the first few logged."""
    logged_before = counters.skipped_samples
    counters.skipped_samples += len(errors)
    if logged_before >= SKIPS_LOGGED:
        return
    for error in errors:
        log.warning("skipped sample %d (producer %s): %s: %s", error["index"], producer,
                    error["exc_type"], error["message"].splitlines()[0] if error["message"] else "")
