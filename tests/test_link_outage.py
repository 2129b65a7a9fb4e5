"""A link down for longer than the liveness window, then up again (network namespaces, tests/netns.py).

Both ends have unacknowledged data on their TCP connection while nothing gets through, so the kernel backs its
retransmissions off exponentially (0.2 s, 0.4 s, ... doubling). Kept, that connection carries nothing until its
next retransmission, seconds after the link is back: a trial saw a producer's HELLOs get through but no WELCOME
come back for 12 s after a 15 s outage, the producer flapping between joined and lost meanwhile. Each side's
socket now gives such a connection up after its liveness window, and a connect after it (common/deadlinks.py), so
ZeroMQ reconnects on a fresh connection as soon as the link is back.

"partition" drops every packet (iptables), as a cut far away does: this is the case that backed off (a 7 s outage
took 6.5 s to recover from, the producer admitted 7 times, before the change). "link down" takes the veth pair
down, as the trial did; on the kernels here a local interface coming up gets the old connection going at once,
so it guards the recovery without telling the change apart.
"""

import json
import queue
import subprocess
import sys
import threading
import time

import pytest

from ferry.common.constants import RECONNECT_IVL_MAX_MS

from tests.datasets import PairDataset

from .helpers import REPO, producer_env, reference_batches
from .netns import make_hosts

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # 15 s each, most of it the outage

HEARTBEAT_S = 0.2  # both sides' (the trainer's default, the producer's --heartbeat), LIVENESS 5: a 1 s window
WINDOW_S = 5 * HEARTBEAT_S
#: Down this long, a kept connection's next retransmission (at 6.2 s, then 12.6 s of backing off from a 0.2 s RTO)
#: comes some 5 s after the link is back: well past a fresh connection's.
OUTAGE_S = 7.0
#: A fresh connection: libzmq's next reconnect (at most RECONNECT_IVL_MAX_MS apart), then HELLO, WELCOME, a TASK
#: and its batch, a heartbeat or two each way.
BACK_WITHIN_S = RECONNECT_IVL_MAX_MS / 1000 + 3 * HEARTBEAT_S
LENGTH = 400
#: High enough that a producer flapping between joined and lost shows as that, not as a poisoned task.
MAX_ATTEMPTS = 20


@pytest.fixture
def hosts():
    h = make_hosts("down")
    yield h
    h.close()


class Trainer:
    """tests/netns_trainer.py in namespace ``a``; its lines, stamped with when they arrived, read with a deadline."""

    def __init__(self, hosts, endpoint: str) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", hosts.a, sys.executable, "-m", "tests.netns_trainer", endpoint, str(LENGTH), "0.01",
             str(HEARTBEAT_S), str(MAX_ATTEMPTS)],
            cwd=REPO, env=producer_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=_read_lines, args=(self.proc.stdout, self._lines), daemon=True)
        self._reader.start()
        self.batches: list[tuple[float, dict]] = []  # (arrival, record), in order
        self.epochs: dict[int, list] = {}
        self.ended: list[int] = []

    def read_until(self, predicate, what: str, timeout: float) -> tuple[float, dict]:
        """The first line from now on whose ``predicate(arrival, record)`` holds, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._next(deadline, what, timeout)
            assert line is not None, f"the trainer exited (status {self.proc.wait(10)}) before {what}"
            if predicate(*line):
                return line

    def stop(self, timeout: float) -> int:
        """Finish the current epoch, read every line to the end, and return the trainer's exit status."""
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while self._next(deadline, "the trainer's exit", timeout) is not None:
            pass
        return self.proc.wait(timeout)

    def _next(self, deadline: float, what: str, timeout: float) -> tuple[float, dict] | None:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s") from None
        if line is not None:
            arrival, record = line
            if "labels" in record:
                self.batches.append(line)
                self.epochs.setdefault(record["epoch"], []).append(record["labels"])
            elif "end" in record:
                self.ended.append(record["end"])
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        self.proc.stdout.close()
        self.proc.stdin.close()


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((time.monotonic(), json.loads(line)))
    lines.put(None)


@pytest.mark.parametrize("outage", ["partition", "link down"])
def test_producer_is_back_at_once_after_an_outage_longer_than_the_liveness_window(hosts, spawn, outage):
    endpoint = f"tcp://{hosts.addr_a}:5555"
    cut = hosts.partition if outage == "partition" else lambda down: hosts.link(not down)
    trainer = Trainer(hosts, endpoint)
    far = spawn(endpoint, "tests.datasets:PidDataset", {"length": LENGTH, "delay": 0.002}, threads=2, slots=2,
                heartbeat=HEARTBEAT_S, netns=hosts.b)
    try:
        trainer.read_until(lambda _, r: r.get("pid") == far.pid, "a first batch from the far producer", 60)
        cut(True)
        time.sleep(OUTAGE_S)  # the outage itself
        cut(False)
        up = time.monotonic()
        back, record = trainer.read_until(lambda arrival, r: arrival > up and r.get("pid") == far.pid,
                                          "a batch from the far producer after the link came back", 60)
        assert back - up <= BACK_WITHIN_S, (
            f"the producer served again {back - up:.1f} s after the link came back, not within {BACK_WITHIN_S:.1f} s "
            f"(admitted {record['seen']} times by then)")
        assert record["seen"] == 2, f"admitted {record['seen']} times by its first batch after the outage, not twice"
        # no flapping: it stays joined for three liveness windows of batches after it is back
        trainer.read_until(lambda arrival, _: arrival > back + 3 * WINDOW_S, "three windows of batches", 30)
        assert trainer.stop(60) == 0
        seen = sorted({r["seen"] for _, r in trainer.batches})
        assert seen == [1, 2], f"admissions seen by the batches: {seen}; only the one rejoin was expected"
        log = far.output()
        welcomed, lost = log.count("serving consumer at"), log.count("silent for")
        assert (welcomed, lost) == (2, 1), f"the producer was welcomed {welcomed} times and lost its consumer {lost}"
        assert trainer.ended, "no epoch completed"
        for epoch in trainer.ended:
            expected = reference_batches(PairDataset(LENGTH), batch_size=4, drop_last=False, world_size=1, rank=0,
                                         shuffle=True, seed=8, epoch=epoch)
            assert trainer.epochs[epoch] == [e[1].tolist() for e in expected], f"epoch {epoch} lost or duplicated"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- producer ---\n{far.output()[-3000:]}") from None
    finally:
        trainer.close()
