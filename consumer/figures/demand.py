"""The demand gauge: how many producers of the current speed the training loop needs to stop waiting.

The loader samples its figures about once a second (:class:`DemandSample`) and, over the last
``window_s`` seconds of samples, estimates:

* ``want``: the batches per second the loop would take if it never waited (batches over the loop's time
  *not* spent waiting for data);
* ``per_producer``: the batches per second one producer delivers with every slot busy: batches received over
  the *producer time in use* (the core integrates how many producers had every slot holding a task, over time:
  ``busy_s``). A producer that waits for credits (a loop that keeps up) is not counted busy, so its capacity is
  not underestimated when the loop, not the producers, sets the pace;
* ``needed = want / per_producer``, capped where the consumer itself is the bound: its io and staging threads
  take in at most ``received / their CPU seconds`` batches per second, and producers beyond that would only
  queue.

The raw estimate is smoothed (an exponential average, ``SMOOTHING`` per sample) and published as a whole number
that changes only when the new value has held for ``HOLD`` samples in a row, so an engine that scales on it does
not flap. Windows in which the loop did not run (an evaluation, the other loader's turn, between epochs) say
nothing and leave the gauge as it was. Before the first full window it is None.

Limits: a slow link looks like slow producers (a task's time in flight includes the wire); producers that share
the trainer's own CPUs do not add capacity as the gauge assumes. Several ranks of one job each publish their own
demand: the job's is their sum (docs/deployment.md#scaling-on-demand).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["DemandSample", "DemandGauge"]

#: Seconds of samples an estimate is taken over. [Unit: second]
WINDOW_S = 5.0
#: Weight of each new estimate in the smoothed one.
SMOOTHING = 0.5
#: Samples in a row a new whole number must hold before it is published.
HOLD = 2
#: Fewer batches than this in a window say too little.
MIN_BATCHES = 3


@dataclass(frozen=True)
class DemandSample:
    """The loader's cumulative figures at one moment (every field only grows)."""

    at: float  # time.monotonic() [Unit: second]
    batches: int  # yielded to the loop
    wait_s: float  # the loop's time waiting for data
    active_s: float  # the loop's time iterating
    received: int  # batches received by the io thread
    busy_s: float  # producer time in use (the core's busy_s) [Unit: second]
    consumer_cpu_s: float | None  # CPU time of the io and staging threads; None: unknown


class DemandGauge:
    """See the module docstring. ``add`` a sample about once a second; read ``value``."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[DemandSample] = deque()
        self._smoothed: float | None = None
        self._proposed: int | None = None
        self._held = 0
        self.value: int | None = None  # the published demand
        self.raw: float | None = None  # the latest unsmoothed estimate

    def add(self, sample: DemandSample) -> None:
        self._samples.append(sample)
        while len(self._samples) > 2 and sample.at - self._samples[1].at >= self.window_s:
            self._samples.popleft()
        first = self._samples[0]
        if sample.at - first.at < self.window_s:
            return
        estimate = self.estimate(first, sample)
        if estimate is None:
            return
        self.raw = estimate
        self._smoothed = estimate if self._smoothed is None else self._smoothed + SMOOTHING * (estimate - self._smoothed)
        proposed = max(1, math.ceil(self._smoothed - 0.05))  # a hair over a whole number is that number
        if proposed == self.value:
            self._proposed, self._held = None, 0
            return
        self._held = self._held + 1 if proposed == self._proposed else 1
        self._proposed = proposed
        if self.value is None or self._held >= HOLD:
            self.value, self._proposed, self._held = proposed, None, 0

    @staticmethod
    def estimate(a: DemandSample, b: DemandSample) -> float | None:
        """Producers needed over ``[a, b]``, or None when the window says too little."""
        batches, seconds = b.batches - a.batches, b.at - a.at
        working = (b.active_s - a.active_s) - (b.wait_s - a.wait_s)
        received, busy = b.received - a.received, b.busy_s - a.busy_s
        if batches < MIN_BATCHES or working <= 0 or received <= 0 or busy <= 0 or seconds <= 0:
            return None
        want = batches / working  # batches/s the loop takes when it does not wait
        per_producer = received / busy  # batches/s of one producer with every slot busy
        needed = want / per_producer
        if a.consumer_cpu_s is not None and b.consumer_cpu_s is not None and b.consumer_cpu_s > a.consumer_cpu_s:
            ingest = received / (b.consumer_cpu_s - a.consumer_cpu_s)  # batches/s at full use of its threads
            if ingest < want:
                needed = min(needed, ingest / per_producer)
        return needed
