"""Where the socket path's CPU goes: Ferry's ingest against raw pyzmq, per thread of both processes.

python -m benchmarks.socket_path [--mib 0.25,1,4] [--transport tcp|ipc] [--repeats 3] [--total-mib 512]

Each peer runs in its own process, as in scenario 4 (:mod:`benchmarks.ingest_peers`); Ferry and raw pyzmq
alternate A B A B. For every run it prints the rate and the CPU per batch of the receiver and of the sender,
each thread's share (``/proc/PID/task``, over the timed part only), then the medians and the ratios. This is
the tool behind docs/performance.md's "socket path" figures; it does not write a results file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict

from .ingest_peers import thread_cpu
from .scenarios import INGEST_SLOTS, REPO, env, ferry_sender, free_endpoint, stop_processes

PEERS = [sys.executable, "-m", "benchmarks.ingest_peers"]


def run_pair(system: str, mib: float, count: int, endpoint: str, timeout: float = 600) -> dict:
    """One measurement; the receiver's JSON with ``sender`` (the sender's per-thread CPU over the timed part)."""
    if system == "ferry":
        receiver, sender = [*PEERS, "ferry-consume", endpoint, str(mib), str(count)], ferry_sender(endpoint, mib)
    else:
        receiver = [*PEERS, "raw-pull", endpoint, str(mib), str(count)]
        sender = [*PEERS, "raw-push", endpoint, str(mib), str(count)]
    recv = subprocess.Popen(receiver, env=env(), cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    send = subprocess.Popen(sender, env=env(), cwd=REPO, stdin=subprocess.DEVNULL)
    try:
        before, result = {}, None
        assert recv.stdout is not None
        for line in recv.stdout:  # ends when the receiver exits (it always prints, or fails)
            record = json.loads(line)
            if record.get("started"):
                before = thread_cpu(send.pid)
            else:
                after = thread_cpu(send.pid)
                record["sender"] = {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}
                result = record
        recv.wait(timeout)
        if result is None:
            raise RuntimeError(f"{system} receiver exited {recv.returncode} without a result")
        return result
    finally:
        stop_processes((send, recv))


def per_batch_us(threads: dict[str, float], batches: int) -> dict[str, float]:
    """Each thread *kind* (name without the tid and pool number) in µs of CPU per batch."""
    kinds: dict[str, float] = defaultdict(float)
    for key, seconds in threads.items():
        name = key.rsplit("/", 1)[0].rstrip("0123456789_")
        kinds[name] += seconds
    return {k: round(v / batches * 1e6) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v > 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.socket_path", description=__doc__)
    parser.add_argument("--mib", default="0.25,1,4")
    parser.add_argument("--transport", default="tcp", choices=("tcp", "ipc"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-mib", type=float, default=512)
    args = parser.parse_args(argv)
    print(f"slots {INGEST_SLOTS}", flush=True)
    for mib in (float(x) for x in args.mib.split(",")):
        count = max(20, int(args.total_mib / mib))
        rates: dict[str, list[float]] = defaultdict(list)
        cpus: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeats):
            for system in ("ferry", "pyzmq"):
                endpoint = (free_endpoint() if args.transport == "tcp"
                            else f"ipc:///tmp/ferry-socket-path-{system}.sock")
                r = run_pair(system, mib, count, endpoint)
                recv_us = r["cpu_s"] / count * 1e6
                send_us = sum(r["sender"].values()) / count * 1e6
                rates[system].append(r["gbps"])
                cpus[system].append(recv_us)
                print(f"{mib:g} MiB {system:5s} {r['gbps']:.2f} GB/s  receiver {recv_us:.0f} µs/batch "
                      f"{per_batch_us(r['threads'], count)}  sender {send_us:.0f} µs/batch "
                      f"{per_batch_us(r['sender'], count)}", flush=True)
        f, z = statistics.median(rates["ferry"]), statistics.median(rates["pyzmq"])
        cf, cz = statistics.median(cpus["ferry"]), statistics.median(cpus["pyzmq"])
        print(f"== {mib:g} MiB {args.transport}: ferry {f:.2f} ({min(rates['ferry']):.2f}..{max(rates['ferry']):.2f}) "
              f"pyzmq {z:.2f} ({min(rates['pyzmq']):.2f}..{max(rates['pyzmq']):.2f}) GB/s, ratio {f / z:.2f}; "
              f"receiver CPU/batch ferry {cf:.0f} µs, pyzmq {cz:.0f} µs, ratio {cf / cz:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
