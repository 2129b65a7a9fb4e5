"""What bounds a run (DESIGN §9): a verdict from one epoch's figures, for people.

Inputs are what the loader measures anyway: the time the loop waited for data and the time it ran, the
batches delivered per producer, and how often the credit window (``buffer_batches``) was full when the loop
had to wait. The reasoning, in order:

1. stall <= 10 %: not data-bound; more producers will not speed the loop up.
2. the window was full while the loop waited: batches are in flight but the window is too small for the
   load latency (Little's law: in flight ~ step rate x batch latency); raise ``buffer_batches``.
3. otherwise the producers cannot keep up: at the measured rate per producer, about
   ``ceil(1.1 x step rate / rate per producer)`` producers remove the stall. When the producers were idle
   (free slots while the loop waited), the transport or the consumer is the bound instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EpochFigures:
    batches: int
    wait_s: float
    active_s: float
    producers: int
    batches_by_producer: dict[str, int]
    window_full_waits: int  # __next__ calls that had to wait while the window was full
    idle_waits: int  # __next__ calls that had to wait while producers had free slots
    waits: int  # __next__ calls that had to wait at all


def diagnose(f: EpochFigures) -> str:
    if f.batches == 0 or f.active_s <= 0:
        return "no batches yet: nothing to diagnose"
    stall = f.wait_s / f.active_s
    step_s = max(1e-9, (f.active_s - f.wait_s) / f.batches)
    head = f"stall {100 * stall:.1f} % over {f.batches} batches (step {1e3 * step_s:.1f} ms)"
    if stall <= 0.10:
        return f"{head}: not data-bound; the loop itself sets the pace, and more producers will not help"
    if f.waits and f.window_full_waits / f.waits > 0.5:
        return (f"{head}: bound by the credit window: it was full in {f.window_full_waits} of {f.waits} waits. "
                f"Batches take longer to load than buffer_batches steps; raise buffer_batches (in flight needed "
                f"~ batch latency / step time)")
    rate_all = f.batches / f.active_s
    active = [n for n in f.batches_by_producer.values() if n > 0] or [f.batches]
    per_producer = rate_all / max(1, len(active))
    needed = math.ceil(1.1 / step_s / per_producer) if per_producer > 0 else 0
    if f.waits and f.idle_waits / f.waits > 0.5:
        return (f"{head}: producers had free slots while the loop waited ({f.idle_waits} of {f.waits} waits): "
                f"bound by the transport or the consumer, not by loading; check the network and max message "
                f"sizes, or use a faster link")
    return (f"{head}: bound by the producers ({len(active)} delivering {per_producer:.1f} batches/s each, the "
            f"loop wants {1 / step_s:.1f}/s): about {needed} producers would remove the stall")
