"""The processes of the ingest scenario (benchmarks/scenarios.py, scenario 4): each peer in its own process,
Ferry's and raw pyzmq's alike, so that neither side shares an interpreter or a heap with the benchmark.

python -m benchmarks.ingest_peers ferry-consume ENDPOINT MIB COUNT [BUFFER_BATCHES]  # RemoteLoader
python -m benchmarks.ingest_peers raw-pull ENDPOINT MIB COUNT        # PULL + recv_multipart(copy=False)
python -m benchmarks.ingest_peers raw-push ENDPOINT MIB COUNT        # PUSH, same-size frames
(Ferry's sender is a plain ``python -m ferry.producer`` serving ``benchmarks.datasets:Blank``.)

A receiver binds ENDPOINT, takes WARMUP batches, then times COUNT batches and prints one JSON line:
``{"gbps": ..., "minflt_per_gb": ..., "cpu_s": ...}``. Each hands every batch to its loop as a tensor
(``torch.frombuffer`` for raw pyzmq, Ferry's own staging for Ferry): the same work a training loop sees.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

WARMUP = 8


def _usage() -> tuple[int, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_utime + r.ru_stime


def thread_cpu(pid: int | str = "self") -> dict[str, float]:
    """CPU seconds (user + system) of each thread of process ``pid``, from ``/proc/PID/task``, keyed
    ``name/tid``; {} where /proc cannot be read (the process ended, or no /proc)."""
    out, tick = {}, os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()} if pid == "self" else {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), "main" if tid == str(pid) else name)
        out[f"{name}/{tid}"] = (int(rest[11]) + int(rest[12])) / tick  # utime, stime
    return out


def _measure(next_batch_bytes, count: int) -> None:
    """The one measurement both receivers share: WARMUP batches, then ``count`` timed ones, each taken by
    ``next_batch_bytes()`` (which hands the batch to the loop as tensors and returns its array bytes); prints
    a ``{"started": true}`` line as the timed part begins (so that a harness can read the sender's CPU over
    the same span), then one JSON line: rate, faults, CPU (all threads, and ``threads``: each thread's, from
    /proc)."""
    for _ in range(WARMUP):
        next_batch_bytes()
    print(json.dumps({"started": True}), flush=True)
    faults, cpu = _usage()
    threads = thread_cpu()
    start = time.perf_counter()
    nbytes = sum(next_batch_bytes() for _ in range(count))
    took = time.perf_counter() - start
    faults2, cpu2 = _usage()
    threads = {k: round(v - threads.get(k, 0.0), 3) for k, v in thread_cpu().items()}
    print(json.dumps({"gbps": nbytes / took / 1e9, "minflt_per_gb": (faults2 - faults) / (nbytes / 1e9),
                      "cpu_s": cpu2 - cpu, "seconds": took, "batches": count, "threads": threads}), flush=True)


def ferry_consume(endpoint: str, mib: float, count: int, buffer_batches: int = 8) -> None:
    from ferry import RemoteLoader, keep_freed_memory

    keep_freed_memory()  # the trainer's explicit choice (docs/tuning.md#frame-size); raw pyzmq keeps glibc's

    # compression off: the payload is zeros, which no codec meets in real data, and raw pyzmq sends them raw;
    # these rows measure the socket path (scenario 7 measures compression)
    with RemoteLoader(endpoint=endpoint, batch_size=1, buffer_batches=buffer_batches, no_producer_timeout=120,
                      heartbeat=0.2, compression=None) as loader:
        it = iter(loader)
        _measure(lambda: next(it)[0].numel(), count)


def raw_pull(endpoint: str, mib: float, count: int, *_: int) -> None:
    import torch
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 4)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(endpoint)

    def next_batch_bytes() -> int:
        frames = pull.recv_multipart(copy=False)
        batch = [torch.frombuffer(f.buffer, dtype=torch.uint8) for f in frames[1:]]
        return batch[0].numel()

    try:
        _measure(next_batch_bytes, count)
    finally:
        pull.close(0)
        ctx.term()


def raw_push(endpoint: str, mib: float, count: int, *_: int) -> None:
    import numpy as np
    import zmq

    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 4)
    push.setsockopt(zmq.LINGER, 5000)
    push.connect(endpoint)
    data = np.zeros(int(mib * (1 << 20)), np.uint8)
    labels = np.zeros(1, np.int64)
    header = b"\x80" * 96  # about the size of Ferry's BATCH header
    for _ in range(WARMUP + count):
        push.send_multipart([header, data, labels], copy=False)
    push.close()
    ctx.term()


def main(argv: list[str]) -> int:
    mode, endpoint, mib, count, *more = argv[0], argv[1], float(argv[2]), int(argv[3]), *map(int, argv[4:])
    {"ferry-consume": ferry_consume, "raw-pull": raw_pull, "raw-push": raw_push}[mode](endpoint, mib, count, *more)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
