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
    from ferry.producer.io.buffers import tracked

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


class CoreRound:
    """The consumer core's whole Python per batch, without threads or sockets: a producer (4 slots) answers
    every task it holds, ``burst`` answers fed as one event (``received_burst``) or one at a time, and the loop
    takes each batch and gives its credit back (in one ``released`` per burst, or one each). ``__call__`` runs
    one burst; the time per batch is the time per call over ``burst``."""

    def __init__(self, mib: float, burst: int) -> None:
        from ferry.common.plan import EpochPlan
        from ferry.consumer.core import ConsumerCore, CoreConfig, Deliver, Send, sequencer_for
        from ferry.consumer.figures.counters import Counters

        self._deliver, self._send, self.burst = Deliver, Send, burst
        self.core = ConsumerCore(CoreConfig(capacity=8, heartbeat=1.0, liveness=3, task_timeout=1e9, on_error="raise",
                                            max_batch_bytes=1 << 31, max_attempts=3),
                                 session=7, now=0.0, counters=Counters())
        self.core.received([b"p", protocol.pack(protocol.HELLO, producer="x", nonce=1, host="h", pid=1, slots=4,
                                                tasks=burst, dataset={"spec": "s", "len": 1 << 40,
                                                                      "fingerprint": "f"})], 0.0)
        spec, frames = encode_tree([np.zeros((1, int(mib * (1 << 20))), np.uint8), np.zeros(1, np.int64)],
                                   chunk_bytes=DEFAULT_FRAME_BYTES)
        self._spec, self._frames = spec, [bytes(f) for f in frames]
        plan = EpochPlan.from_indices(0, np.arange(1 << 20), 1, False)
        self._tasks: list[dict] = []
        self._take(self.core.start_run(sequencer_for(1, plan, 0, (0, 0), in_order=True), 0, 0.0))

    def _take(self, actions: list) -> int:
        """Note the tasks sent; the number of batches handed on."""
        for a in actions:
            if isinstance(a, self._send) and a.tasks:
                self._tasks += protocol.task_headers(protocol.parse_header(a.frames[0]))
        return sum(isinstance(a, self._deliver) for a in actions)

    def _message(self, task: dict) -> tuple[list, None, str]:
        header = protocol.pack(protocol.BATCH, session=7, task=task["task"], epoch=0, seq=task["seq"],
                               tree=self._spec, errors=[])
        return [b"p", header, *self._frames], None, "127.0.0.1"

    def __call__(self) -> None:
        answers, self._tasks = self._tasks[: self.burst], self._tasks[self.burst:]
        if self.burst == 1:
            for task in answers:
                if self._take(self.core.received(*self._message(task)[:1], 0.0, address="127.0.0.1")):
                    self._take(self.core.released(1, 0.0))
            return
        taken = self._take(self.core.received_burst([self._message(t) for t in answers], 0.0))
        self._take(self.core.released(1, 0.0, taken))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    for name, fn in pieces(args.mib).items():
        best = min(timeit.repeat(fn, number=args.number, repeat=5)) / args.number
        print(f"{name:45s} {best * 1e6:8.1f} us")
    for burst in (1, 4):  # the whole core per batch (includes packing each BATCH header and parsing each TASK)
        best = min(timeit.repeat(CoreRound(args.mib, burst), number=args.number, repeat=5)) / args.number / burst
        print(f"{f'consumer core: a batch, in bursts of {burst}':45s} {best * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
