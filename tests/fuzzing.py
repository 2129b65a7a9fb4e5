"""Seeded generators of hostile messages: random bytes and mutations of valid ones."""

from __future__ import annotations

import random
from typing import Any

import msgpack

from ferry.common.constants import PROTOCOL_VERSION

BAD_DTYPES = ["|O", ">f4", "<U4", "|V8", "<M8[s]", "x", "", 5, None]


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(10 if depth < 3 else 6)
    if choice == 0:
        return rng.randrange(-(1 << 63), 1 << 63)
    if choice == 1:
        return rng.random() * 1e9
    if choice == 2:
        return rng.choice(["", "x" * rng.randrange(100), "TASK", "BATCH", "\u2603"])
    if choice == 3:
        return None
    if choice == 4:
        return rng.choice([True, False])
    if choice == 5:
        return rng.randbytes(rng.randrange(20))
    if choice in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {str(random_value(rng, depth + 1))[:10]: random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def deep(levels: int) -> Any:
    node: Any = 1
    for _ in range(levels):
        node = {"t": "l", "v": [node]}
    return node


def bad_tree(rng: random.Random) -> tuple[Any, list[bytes]]:
    kind = rng.randrange(8)
    if kind == 0:
        return {"t": "a", "d": rng.choice(BAD_DTYPES), "s": [2], "f": 0}, [b"x" * 16]
    if kind == 1:
        return {"t": "a", "d": "<f4", "s": [-rng.randrange(1, 9)], "f": 0}, [b"x" * 4]
    if kind == 2:
        return {"t": "a", "d": "<f4", "s": [1 << 40, 1 << 40], "f": 0}, [b"x" * 8]
    if kind == 3:
        return {"t": "a", "d": "<f4", "s": [3], "f": 0}, [b"x" * rng.randrange(0, 11)]
    if kind == 4:
        return deep(rng.choice([20, 100, 250])), []  # msgpack packs at most 511 levels
    if kind == 5:
        return {"t": "l", "v": [0] * rng.choice([5000, 60000])}, []
    if kind == 6:
        return {"t": "a", "d": "<f4", "s": [1], "f": rng.choice([-1, 1, 7, "0"])}, [b"x" * 4]
    return random_value(rng), [rng.randbytes(rng.randrange(64)) for _ in range(rng.randrange(3))]


def mutate(rng: random.Random, header: dict[str, Any]) -> dict[str, Any]:
    header = dict(header)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        keys = list(header)
        if op == 0 and keys:
            del header[rng.choice(keys)]
        elif op == 1 and keys:
            header[rng.choice(keys)] = random_value(rng)
        elif op == 2:
            header["v"] = rng.choice([0, 2, PROTOCOL_VERSION + 1, "1", None])
        elif op == 3:
            header["type"] = rng.choice(["NOPE", "", 3, "hello", "TASK", "WELCOME", "BATCH", "FAIL"])
        elif op == 4:
            header[str(rng.randrange(1000))] = random_value(rng)
        else:
            for key in ("session", "seq", "task", "epoch"):
                if isinstance(header.get(key), int):
                    header[key] = rng.choice([min(header[key] + 1, (1 << 64) - 1), -1, (1 << 64) - 1, "0", 0.5, True])
    return header


_HUGE_MAP = msgpack.packb({str(i): i for i in range(70_000)})
_OVERSIZED: dict[int, bytes] = {}


def _oversized(max_frame: int) -> bytes:
    if max_frame not in _OVERSIZED:
        _OVERSIZED[max_frame] = b"\0" * (max_frame + 1)
    return _OVERSIZED[max_frame]


def hostile_frames(rng: random.Random, templates: list[dict[str, Any]], max_frame: int,
                   oversize_rate: float = 0.2) -> list[bytes]:
    """One hostile multipart message. ``oversize_rate``: of the 1-in-9 picks of an oversized frame, the share
    actually sent (each one costs the receiver's peer its connection)."""
    kind = rng.randrange(9)
    if kind == 0:
        return [rng.randbytes(rng.randrange(200)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:
        return [pack(mutate(rng, rng.choice(templates)))]
    if kind == 2:  # a BATCH with a hostile tree
        tree, frames = bad_tree(rng)
        header = dict(v=PROTOCOL_VERSION, type="BATCH", session=rng.randrange(1 << 62), task=rng.randrange(100),
                      epoch=0, seq=rng.randrange(100), tree=tree, errors=[])
        return [pack(header), *frames]
    if kind == 3:  # truncated msgpack
        data = pack(rng.choice(templates))
        return [data[: rng.randrange(len(data))]]
    if kind == 4:  # valid header with extra frames
        return [pack(rng.choice(templates)), *[rng.randbytes(8) for _ in range(rng.randrange(1, 4))]]
    if kind == 5:  # a huge msgpack map, just past the decoder's limits
        return [_HUGE_MAP]
    if kind == 6 and rng.random() < oversize_rate:  # over the peer's maximum message size: libzmq drops our connection
        return [pack(rng.choice(templates)), _oversized(max_frame)]
    if kind == 7:  # an empty message
        return [b""]
    return [pack(rng.choice(templates))]  # valid-looking, in the wrong place or at the wrong time
