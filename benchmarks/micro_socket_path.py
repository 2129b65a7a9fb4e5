"""Per-batch Python costs of the socket path, piece by piece, in one thread (no sockets' waits, no GIL
contention): what the io thread does with a BATCH, and what a producer does to send one.

python -m benchmarks.micro_socket_path [--mib 1] [--number 2000]
Prints microseconds per call for each piece (best of 5 repeats). Used to decide which changes to keep
(docs/performance.md, "The socket path").
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import zmq

from ferry.common import protocol
from ferry.common.codec import decode_tree, encode_tree, tree_nbytes, tree_signature
from ferry.common.constants import DEFAULT_FRAME_BYTES


def pieces(mib: float) -> dict[str, callable]:
    from ferry.consumer.core import Delivery
    from ferry.producer.buffers import tracked

    array = np.zeros((1, int(mib * (1 << 20))), np.uint8)
    labels = np.zeros(1, np.int64)
    tree = [array, labels]
    spec, frames = encode_tree(tree, chunk_bytes=DEFAULT_FRAME_BYTES)
    header = protocol.pack(protocol.BATCH, session=1, task=2, epoch=0, seq=3, tree=spec, errors=[])
    zframes = [zmq.Frame(header), *(zmq.Frame(f) for f in frames)]
    buffers = [f.buffer for f in zframes[1:]]
    decoded = decode_tree(spec, buffers)
    parsed = protocol.parse_header(zframes[0])
    return {
        "consumer: parse_header": lambda: protocol.parse_header(zframes[0]),
        "consumer: [f.buffer for f in frames]": lambda: [f.buffer for f in zframes[1:]],
        "consumer: decode_tree": lambda: decode_tree(parsed["tree"], buffers, max_bytes=1 << 31),
        "consumer: tree_signature": lambda: tree_signature(decoded, 1),
        "consumer: tree_nbytes": lambda: tree_nbytes(decoded),
        "consumer: Delivery(...)": lambda: Delivery(run=1, seq=3, tree=decoded, nbytes=10, frames=zframes),
        "producer: encode_tree": lambda: encode_tree(tree, chunk_bytes=DEFAULT_FRAME_BYTES),
        "producer: pack(BATCH)": lambda: protocol.pack(protocol.BATCH, session=1, task=2, epoch=0, seq=3, tree=spec,
                                                       errors=[]),
        "producer: tracked(frames)": lambda: tracked([header, *frames], len(frames)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    for name, fn in pieces(args.mib).items():
        best = min(timeit.repeat(fn, number=args.number, repeat=5)) / args.number
        print(f"{name:45s} {best * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
