"""``local_producers="auto"`` (docs/ARCHITECTURE.md#local-mode): as many local producers as the loop needs.

The decision is made on the training thread, where the demand gauge is sampled (about once a second, after a
batch: :mod:`ferry.consumer.figures.demand`); its action on the ``ferry-local-watch`` thread, which alone starts
and stops producers (:meth:`ferry.consumer.local.LocalProducers.scale_to`). So the gauge is read by the thread that
writes it, and the count crosses threads as one number under the producers' lock.

:class:`ScalePolicy` is the rule, pure arithmetic with the time passed in:

* the target is the gauge's value (producers of the current speed the loop needs), within ``[low, high]``;
* the count changes at most once per *control period* (``AUTOSCALE_PERIOD_S``, 5 s: the gauge's window, so each
  change rests on a window of samples of its own; the gauge publishes a new value only once it held for two
  samples, so one period covers a change's way through the gauge);
* a change against the direction of the last one waits until ``AUTOSCALE_REVERSAL_S`` (60 s) after that change,
  so the direction changes at most once a minute, and one noisy window never undoes a change.

A scale-up goes to the target at once (from one producer: one period for the gauge's first window, one for the
new producers to join and the gauge to see them, so the stall is gone within three); a scale-down goes to the
target too, as late as the reversal rule allows after a scale-up. Windows in which the loop did not run say
nothing (the gauge keeps its value), so an evaluation or the end of an epoch changes nothing.

Limits: producers that share the trainer's CPUs do not add capacity as the gauge assumes, so the default
``high`` is the usable CPUs minus one; past it the loop stays bound by the CPUs, not by the count.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ferry.common.constants import AUTOSCALE_PERIOD_S, AUTOSCALE_REVERSAL_S

from ferry.consumer.options import LocalOptions
from ferry.consumer.options.groups import AUTO

__all__ = ["ScalePolicy", "Autoscaler", "count_bounds", "usable_cpus"]

log = logging.getLogger("ferry.consumer")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset or ``taskset`` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def count_bounds(local: LocalOptions) -> tuple[int, int]:
    """``(fewest, most)`` producers of ``local``: the count twice for a fixed count; for ``"auto"``, ``min``
    (default 1) and ``max`` (default the usable CPUs minus one, at least 1 and at least ``min``)."""
    if local.count != AUTO:
        return local.count, local.count
    low = local.min if local.min is not None else 1
    high = local.max if local.max is not None else max(1, low, usable_cpus() - 1)
    return low, high


class ScalePolicy:
    """When and where the count of local producers changes (see the module docstring).

    Args:
        low, high: the bounds of the count.
        period: the least time between two changes. [Unit: second]
        reversal: the least time between a change and one in the other direction. [Unit: second]

    Raises:
        ValueError: ``low`` below 1 or above ``high``.
    """

    def __init__(self, low: int, high: int, *, period: float = AUTOSCALE_PERIOD_S,
                 reversal: float = AUTOSCALE_REVERSAL_S) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"bounds must satisfy 1 <= low <= high, got {low}, {high}")
        self.low, self.high, self.period, self.reversal = low, high, period, reversal
        self.last_change: float | None = None  # when the count last changed [time.monotonic()]
        self.last_direction = 0  # +1 up, -1 down, 0 none yet

    def decide(self, now: float, current: int, needed: int | None) -> int | None:
        """The count to go to at ``now``, from ``current`` with the gauge at ``needed`` (None: not known yet);
        None to stay. A returned count is taken as done (the next decision counts from ``now``)."""
        if needed is None:
            return None
        target = min(self.high, max(self.low, needed))
        if target == current:
            return None
        direction = 1 if target > current else -1
        if self.last_change is not None:
            since = now - self.last_change
            if since < self.period or (direction == -self.last_direction and since < self.reversal):
                return None
        self.last_change, self.last_direction = now, direction
        return target


class Autoscaler:
    """The policy bound to a loader's local producers: called with each demand sample on the training thread.

    Args:
        producers: the :class:`~ferry.consumer.local.LocalProducers` it scales (``count``, ``scale_to``).
        policy: the rule; by default one over the producers' bounds.
    """

    def __init__(self, producers: Any, policy: ScalePolicy | None = None, *, default_high: bool = False) -> None:
        self.producers = producers
        self.policy = policy or ScalePolicy(producers.low, producers.high)
        self.default_high = default_high  # high is the default (the usable CPUs minus one), not local_producers_max
        self.capped = False  # whether the loop has needed more than high (said once)

    def __call__(self, now: float, needed: int | None) -> None:
        current = self.producers.count
        if needed is not None and needed > self.policy.high and not self.capped:
            self.capped = True
            log.info("ferry: the loop needs about %d local producers of the current speed; at most %d run here (%s)."
                     " Producers on more cores than the machine has only share them with training: run more on "
                     "other hosts, or make each faster (docs/tuning.md)", needed, self.policy.high,
                     ("local_producers_max" if not self.default_high else
                      f"the usable CPUs minus one: {usable_cpus()} CPUs; local_producers_max raises it"
                      if self.policy.high == max(1, usable_cpus() - 1) else "local_producers_min"))
        target = self.policy.decide(now, current, needed)
        if target is None:
            return
        log.info("ferry: local producers %d -> %d (the loop needs %d of the current speed; bounds %d..%d)",
                 current, target, needed, self.policy.low, self.policy.high)
        self.producers.scale_to(target)
