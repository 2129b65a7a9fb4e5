"""Ferry's wire protocol (docs/ARCHITECTURE.md#messages): message types, encoding, and validation on receipt.

Every message is multipart. Frame 0 is a msgpack map holding ``v`` (the protocol version), ``type`` and
the fields listed in :data:`SCHEMAS`. A BATCH carries its array leaves as further raw frames (see
:mod:`ferry.common.codec`). Nothing is pickled, but the values a consumer lets its own local producers pickle.

``parse_header`` is the single gate for frame 0: it rejects anything that is not a map of the known type
with the required fields of the right types, and raises :class:`~ferry.common.errors.ProtocolError` with the
reason. Callers count and drop; they never let it escape a loop.

Fields (docs/ARCHITECTURE.md#messages): TASK carries ``task`` (a unique id of this issuance, so that a re-issued
batch and its late twin are told apart without guessing) and ``on_error``; BATCH and FAIL echo ``task``;
HELLO carries ``nonce``, which changes whenever the producer drops its state for this consumer, and ``dataset``
(``spec``, ``len``, ``fingerprint``; for a sharded dataset ``sharded`` and, where it gives ``shard_len`` for at most
MAX_ANNOUNCED_SHARDS shards, ``shard_lens``: the samples of each shard, so that ``len(loader)`` is known without
the dataset; for an iterable dataset ``iterable`` and ``sized``, its ``len`` then ``len(dataset)`` or 0).
An iterable dataset's producer says its ``worker`` place (``[id, count]``) in HELLO, and its TASKs carry
``streams`` (see :mod:`ferry.common.streamplan`).
**Several tasks in one TASK.** A producer that says HELLO ``tasks: N`` takes TASKs carrying up to N tasks: the
first task's fields are the TASK's own, the others' are the maps of its optional ``more`` list (each with its own
``task``, ``seq``, ``indices`` and the per-task optional fields; ``session``, ``epoch``, ``on_error`` and ``seed`` are
the TASK's, for all). :func:`task_headers` splits a TASK into one header per task. A producer that does not say
``tasks`` (a hand-made one, say) gets one task per TASK, as always.
WELCOME says ``frame_bytes`` (leaves up to that many bytes travel as one frame), ``max_batch_bytes`` and
``codecs``. There has only ever been version 1: both sides ship together, so no field is optional for the sake of
an older peer. Optional: HELLO ``shm`` (the token of the consumer's shared-memory
slab the producer mapped), TASK ``slot`` (``[offset, nbytes]`` in that slab, where the batch may be written;
see :mod:`ferry.common.shm`) and TASK ``compression`` (the codec of that task's batch frames, one of the
WELCOME's ``codecs``; see :mod:`ferry.consumer.core.compression`); WELCOME ``pickle`` (this producer may pickle
values no tree spec describes: the consumer's own local producers only), TASK ``unbatched`` (one sample, not a
batch: ``batch_size=None``) and BATCH ``batch_first`` (False: not Ferry's collation, so no sample counts are
checked). A producer pool (:mod:`ferry.common.pool`): HELLO ``pool``
(it opens the dataset a WELCOME names), ``refused`` (it may not: why) and ``dataset.args`` (the arguments a consumer
named it with); WELCOME ``dataset`` (``{spec, args}``: open this and announce it) and ``weight`` (this consumer's
share of the producer's time). A sample error of a BATCH or FAIL may name
its exception's classes (``exc_classes``, a list of ``module:qualname``): names only, from which the consumer
rebuilds the type (:mod:`ferry.common.remote_errors`).
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack

from ferry.common.canary import MAX_STRUCTURE_CHARS, valid_wire
from ferry.common.constants import (MAX_ANNOUNCED_SHARDS, MAX_CLASS_PATH, MAX_DATASET_LEN, MAX_EXC_CLASSES,
                                    MAX_HEADER_BYTES, MAX_SLOTS, MAX_STREAMS, MAX_TASK_INDICES, MAX_TEXT,
                                    PROTOCOL_VERSION)
from ferry.common.errors import ProtocolError, VersionMismatch
from ferry.common.pool import valid_named, valid_weight

__all__ = [
    "HELLO", "WELCOME", "REJECT", "TASK", "BATCH", "FAIL", "PING", "BYE",
    "pack", "parse_header", "make_header", "task_headers",
]

HELLO, WELCOME, REJECT, TASK, BATCH, FAIL, PING, BYE = (
    "HELLO", "WELCOME", "REJECT", "TASK", "BATCH", "FAIL", "PING", "BYE"
)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _uint(v: Any) -> bool:
    return _int(v) and 0 <= v < (1 << 63)


def _str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _dataset(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _str(v.get("spec"))
        and _uint(v.get("len"))
        and v["len"] <= MAX_DATASET_LEN
        and _str(v.get("fingerprint"))
        and ("shard_lens" not in v or _shard_lens(v["shard_lens"], v))
        and ("iterable" not in v or v["iterable"] is True)
        and ("sized" not in v or (v.get("iterable") is True and isinstance(v["sized"], bool)))
        and ("args" not in v or valid_named({"spec": v["spec"] or "-", "args": v["args"]}))
        and ("canary" not in v or valid_wire(v["canary"], MAX_STRUCTURE_CHARS))
        and ("code" not in v or (isinstance(v["code"], str) and len(v["code"]) <= 64))
    )


def _shard_lens(v: Any, dataset: dict[str, Any]) -> bool:
    """A sharded dataset's optional ``shard_lens``: the samples of each shard, in ``shards()`` order, one per shard
    (its ``len``); what ``len(loader)`` is computed from where the consumer does not hold the dataset."""
    return (dataset.get("sharded") is True and isinstance(v, list) and len(v) == dataset["len"]
            and len(v) <= MAX_ANNOUNCED_SHARDS and all(_uint(n) for n in v))


def _indices(v: Any) -> bool:
    return isinstance(v, list) and 0 < len(v) <= MAX_TASK_INDICES and all(_uint(i) for i in v)


def _slots(v: Any) -> bool:
    return _int(v) and 1 <= v <= MAX_SLOTS


def _errors(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_TASK_INDICES and all(_sample_error(e) for e in v)


def _sample_error(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _uint(v.get("index"))
        and _str(v.get("exc_type"))
        and _str(v.get("message"))
        and _str(v.get("traceback"))
        and ("exc_classes" not in v or _class_names(v["exc_classes"]))
    )


def _class_names(v: Any) -> bool:
    """A sample error's optional ``exc_classes``: its exception's class and bases as ``module:qualname``, most
    derived first (see :mod:`ferry.common.remote_errors`, which decides what may be rebuilt from them)."""
    return isinstance(v, list) and len(v) <= MAX_EXC_CLASSES and all(
        isinstance(c, str) and 0 < len(c) <= MAX_CLASS_PATH for c in v)


Check = Callable[[Any], bool]

#: Required fields of each message type, with their checks. Optional fields are checked where used.
SCHEMAS: dict[str, dict[str, Check]] = {
    HELLO: {"producer": _str, "nonce": _uint, "host": _str, "pid": _uint, "slots": _slots, "dataset": _dataset},
    # frame_bytes: the largest array leaf the consumer wants as one frame (the producer clamps it into
    # MIN/MAX_FRAME_BYTES); max_batch_bytes: the largest batch it accepts (a bigger one is answered by a FAIL);
    # codecs: what it can decompress (a producer never sends another codec)
    WELCOME: {"session": _uint, "heartbeat": _num, "nonce": _uint, "frame_bytes": lambda v: _uint(v) and v > 0,
              "max_batch_bytes": lambda v: _uint(v) and v > 0,
              "codecs": lambda v: isinstance(v, list) and len(v) <= 8 and all(_str(c) for c in v)},
    REJECT: {"reason": _str, "permanent": lambda v: isinstance(v, bool)},
    TASK: {"session": _uint, "task": _uint, "epoch": _uint, "seq": _uint, "indices": _indices,
           "on_error": lambda v: v in ("raise", "skip")},
    BATCH: {"session": _uint, "task": _uint, "epoch": _uint, "seq": _uint, "tree": lambda v: True,
            "errors": _errors},
    FAIL: {"session": _uint, "task": _uint, "epoch": _uint, "seq": _uint, "errors": _errors},
    PING: {"load": lambda v: isinstance(v, dict) and len(v) <= 32},
    BYE: {},
}


#: What each task of a TASK says for itself (the rest, ``session``, ``epoch``, ``on_error`` and ``seed``, is
#: the TASK's for every task it carries): required, then optional.
TASK_OWN: dict[str, Check] = {"task": _uint, "seq": _uint, "indices": _indices}
TASK_OWN_OPTIONAL = ("slot", "compression", "shard", "unbatched", "streams")


def _more_tasks(v: Any) -> bool:
    """A TASK's ``more``: the other tasks it carries, each a map of its own fields (:data:`TASK_OWN`, and the
    optional ones of :data:`TASK_OWN_OPTIONAL`), nothing else."""
    if not (isinstance(v, list) and 0 < len(v) < MAX_SLOTS):
        return False
    optional = OPTIONAL[TASK]
    for task in v:
        if not isinstance(task, dict) or not all(key in task and check(task[key]) for key, check in TASK_OWN.items()):
            return False
        if any(key not in TASK_OWN and (key not in TASK_OWN_OPTIONAL or not optional[key](value))
               for key, value in task.items()):
            return False
    return True


#: Optional fields, checked when present.
OPTIONAL: dict[str, dict[str, Check]] = {
    HELLO: {"shm": _str,
            # takes TASKs that carry up to this many tasks (``more``); absent: one task per TASK
            "tasks": lambda v: _uint(v) and 1 <= v <= MAX_SLOTS,
            # takes this many tasks beyond its slots, queued until a slot is free; absent: its slots only
            "ahead": lambda v: _uint(v) and v <= MAX_SLOTS,
            # it loads its dataset one sample at a time because it is a user's class and --threads was not given
            # (producer/loading/samples.py): the consumer's diagnosis names --threads when the producers are the bound
            "serial": lambda v: v is True,
            # an iterable dataset's producer: its [worker id, worker count] (a local producer's place in its loader)
            "worker": lambda v: isinstance(v, list) and len(v) == 2 and all(_uint(x) for x in v) and v[0] < v[1],
            # a pool producer (common/pool.py): it loads the dataset a WELCOME names; or it cannot load the one
            # named to it, and says why (the consumer answers a permanent REJECT)
            "pool": lambda v: v is True, "refused": _str},
    # the producer may pickle what no tree spec describes: only the consumer's own local producers (ipc, same
    # user; consumer/core/admission.py), never a producer over the network
    # dataset: {spec, args}, the dataset a pool producer is to open and announce in its next HELLO (common/pool.py);
    # weight: this consumer's share of the producer's time against its other consumers' (producer/core/fairshare.py)
    WELCOME: {"pickle": lambda v: v is True, "dataset": valid_named, "weight": valid_weight},
    TASK: {"slot": lambda v: isinstance(v, list) and len(v) == 2 and all(_uint(x) for x in v) and v[1] > 0,
           "seed": _uint,  # the loader's seed, from which each sample's sample_info().seed is derived
           # the codec for this task's batch frames (absent: none); the consumer decides, "auto" included
           "compression": lambda v: v in ("lz4", "zstd"),
           # a sharded dataset's task: [batch k, batch_size, drop_last, shuffle] of the shard indices[0] names
           "shard": lambda v: isinstance(v, list) and len(v) == 4 and all(_uint(x) for x in v) and v[1] > 0,
           # an unbatched loader's task (batch_size=None): one sample, dataset[indices[0]] ("index") or
           # dataset[indices] ("list", a sampler that yields lists), not collated
           "unbatched": lambda v: v in ("index", "list"),
           # an iterable dataset's task (with "shard"): stream indices[0] of this many (common/streamplan.py)
           "streams": lambda v: _uint(v) and 1 <= v <= MAX_STREAMS,
           # the other tasks this TASK carries (to a producer whose HELLO said ``tasks``): see task_headers
           "more": _more_tasks},
    # a sharded dataset's answer: its sample count (0: the shard has no such batch) and whether it is the last;
    # batch_first False: not Ferry's collation (a user's collate_fn, an unbatched sample): no sample counts checked
    BATCH: {"count": _uint, "last": lambda v: isinstance(v, bool), "batch_first": lambda v: isinstance(v, bool)},
}


def task_headers(header: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks a parsed TASK carries, each as the header of a TASK of its own, the TASK's own task first."""
    first = {key: value for key, value in header.items() if key != "more"}
    common = {key: header[key] for key in ("v", "type", "session", "epoch", "on_error", "seed") if key in header}
    return [first, *({**common, **task} for task in header.get("more", ()))]


def make_header(msg_type: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "type": msg_type, **fields}


def pack(msg_type: str, **fields: Any) -> bytes:
    """Encode frame 0 of a message."""
    return msgpack.packb(make_header(msg_type, **fields), use_bin_type=True)


def parse_header(frame: Any) -> dict[str, Any]:
    """Decode and validate frame 0. Returns the header map.

    Raises:
        ProtocolError: not msgpack, not a map, wrong version, unknown type, or a missing / mistyped field.
    """
    data = bytes(frame.buffer) if hasattr(frame, "buffer") else bytes(frame)
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(data)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_TASK_INDICES,
            max_map_len=MAX_TASK_INDICES,
            max_str_len=MAX_TEXT,
            max_bin_len=MAX_TEXT,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a {type(header).__name__}, not a map")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(version, PROTOCOL_VERSION, header.get("type"))
    msg_type = header.get("type")
    schema = SCHEMAS.get(msg_type) if isinstance(msg_type, str) else None
    if schema is None:
        raise ProtocolError(f"unknown message type {msg_type!r}")
    for key, check in schema.items():
        if key not in header:
            raise ProtocolError(f"{msg_type} lacks field {key!r}")
        if not check(header[key]):
            raise ProtocolError(f"{msg_type} field {key!r} is invalid: {_short(header[key])}")
    for key, check in OPTIONAL.get(msg_type, {}).items():
        if key in header and not check(header[key]):
            raise ProtocolError(f"{msg_type} field {key!r} is invalid: {_short(header[key])}")
    return header


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
