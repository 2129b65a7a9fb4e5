"""What a producer's answer to a task may hold: the decoding and checks of BATCH and FAIL. No sockets here.

* A BATCH must answer its task's seq in the current epoch, decode within ``max_batch_bytes``, hold exactly
  the samples the task asked for (less the ones it reports failed), and have the structure and dtypes of
  the first batch accepted. A BATCH marked ``batch_first: False`` (the user's collate_fn made it, or it is an
  unbatched loader's sample) is checked for its structure only, not its sample counts; the mark is part of the
  structure. Values cannot be checked; a peer that must not be trusted with them must not be let in (CURVE).
  A pickled value is accepted only from a producer the consumer allowed to send one (``pickle_ok``).
* A FAIL is one frame naming at least one sample error. What it raises in the training loop: a batch larger
  than ``max_batch_bytes``, a value of a class that cannot travel (:class:`~ferry.common.errors.BatchTypeError`)
  or an index outside the dataset, whatever ``on_error`` says (no producer could do better:
  :func:`unretryable`); otherwise the first sample's error (of its original type where that can be rebuilt:
  :mod:`ferry.common.remote_errors`), or nothing under ``on_error="skip"``.

A breach raises :class:`~ferry.common.errors.ProtocolError`; the core decides what it costs the peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ferry.common.codec import tree_nbytes, tree_signature
from ferry.common.decoder import decode_tree
from ferry.common.errors import BatchTooLarge, BatchTypeError, ProtocolError, RemoteSampleError, SampleIndexError
from ferry.common.remote_errors import typed_remote_error

__all__ = ["Batch", "BatchDecoder", "check_fail", "unretryable", "sample_error", "skip_lines", "SKIPS_LOGGED"]

#: Skipped samples logged one by one, from the start; the rest are only counted.
SKIPS_LOGGED = 10


@dataclass(frozen=True)
class Batch:
    tree: Any  # views of the frames (and of the task's shared-memory slot, if it had one)
    nbytes: int
    shared: bool  # some of it came through shared memory
    compressed_bytes: int = 0  # wire bytes of its compressed frames
    uncompressed_bytes: int = 0  # what those frames hold once decompressed
    decode_s: float = 0.0  # seconds the io thread took to decompress them (measured by decode_tree)


class BatchDecoder:
    """Decodes and checks BATCH results. Remembers the structure of the first batch it accepted."""

    def __init__(self, max_batch_bytes: int) -> None:
        self.max_batch_bytes = max_batch_bytes
        self._signature: Any = None  # structure and dtypes of the first accepted batch

    def decode(self, header: dict[str, Any], frames: list[Any], *, seq: int, epoch: int, indices: Sequence[int],
               region: Any, pickle_ok: bool = False) -> Batch:
        """The batch answering the task of ``seq`` (of ``epoch``, asking for ``indices``), decoded over
        ``frames`` (buffers) and the task's shared-memory ``region`` (None without one). ``pickle_ok``: its
        producer may send pickled values (the consumer's own local producers).

        Raises:
            ProtocolError: another seq or epoch, a malformed tree, more than ``max_batch_bytes``, samples the task
                did not ask for, a structure other than the first batch's, or a pickled value without ``pickle_ok``.
            BatchTypeError: a registered type that is not registered in this process.
        """
        if (header["epoch"], header["seq"]) != (epoch, seq):
            raise ProtocolError(f"BATCH for task {header['task']} names seq {header['seq']}, expected {seq}")
        compressed = [0, 0, 0.0]  # wire and raw bytes of compressed frames, seconds decompressing them
        tree = decode_tree(header["tree"], frames, max_bytes=self.max_batch_bytes, region=region,
                           compressed=compressed, pickle_ok=pickle_ok)
        self._check_structure(header, tree, indices)
        nbytes = tree_nbytes(tree)
        shared = region is not None and nbytes > sum(len(f) for f in frames)
        return Batch(tree, nbytes, shared, *compressed)

    def _check_structure(self, header: dict[str, Any], tree: Any, indices: Sequence[int]) -> None:
        errors = header["errors"]
        if errors:
            asked = set(indices)
            stray = next((e["index"] for e in errors if e["index"] not in asked), None)
            if stray is not None:
                raise ProtocolError(f"BATCH reports sample {stray} failed, which task {header['task']} did not "
                                    f"ask for")
        batch_first = header.get("batch_first", True)
        signature = (batch_first, tree_signature(tree, len(indices) - len(errors) if batch_first else None))
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            raise ProtocolError("BATCH structure or dtypes differ from the first batch of this dataset")


def check_fail(header: dict[str, Any], frames: list[Any]) -> None:
    if frames or not header["errors"]:
        raise ProtocolError("FAIL must be one frame naming at least one error")


def unretryable(errors: list[dict[str, Any]], *, producer: str, epoch: int, seq: int,
                dataset_len: int | None) -> Exception | None:
    """The error a FAIL names that no producer could avoid, or None: a sample index outside the dataset (the
    plan itself is wrong), a batch larger than max_batch_bytes or holding a class that cannot travel (every
    producer builds the same)."""
    kinds: dict[str, dict[str, Any]] = {}
    for error in errors:
        kinds.setdefault(error["exc_type"], error)  # the first of each kind names it
    if BatchTooLarge.__name__ in kinds:
        return BatchTooLarge(f"{kinds[BatchTooLarge.__name__]['message']} (epoch {epoch}, batch {seq}, "
                             f"from producer {producer})")
    if BatchTypeError.__name__ in kinds:
        return BatchTypeError(f"{kinds[BatchTypeError.__name__]['message']} (epoch {epoch}, batch {seq}, "
                              f"from producer {producer})")
    if SampleIndexError.__name__ in kinds:
        return SampleIndexError(index=kinds[SampleIndexError.__name__]["index"], length=dataset_len or 0,
                                epoch=epoch, seq=seq)
    return None


def sample_error(errors: list[dict[str, Any]], *, producer: str, epoch: int, seq: int) -> RemoteSampleError:
    """The error a FAIL raises in the training loop: its first sample's, of its original type where that can be
    rebuilt (a subclass of it and RemoteSampleError, :mod:`ferry.common.remote_errors`), else RemoteSampleError."""
    first = errors[0]
    return typed_remote_error(first.get("exc_classes", ()), index=first["index"], producer=producer,
                              exc_type=first["exc_type"], message=first["message"], traceback=first["traceback"],
                              epoch=epoch, seq=seq)


def skip_lines(errors: list[dict[str, Any]], producer: str, skipped_before: int) -> list[str]:
    """Log lines for samples skipped under ``on_error="skip"``: the first SKIPS_LOGGED of the loader's life."""
    if skipped_before >= SKIPS_LOGGED:
        return []
    return [f"skipped sample {e['index']} (producer {producer}): {e['exc_type']}: "
            f"{e['message'].splitlines()[0] if e['message'] else ''}" for e in errors]
