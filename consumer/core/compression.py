"""``compression="auto"``, decided by the consumer: which codec its remote producers use (docs/tuning.md#compression).

The consumer sees what a producer cannot: how long its training loop waits for data, how many raw bytes per
second arrive, and what decompressing costs its io thread. :class:`AutoCodec` turns that into one codec for
the consumer's remote links, which the core names in every TASK (``compression``). Pure: no clock, no
socket; ``now`` and the loop's wait come in as values with each arrival.

* Local links never compress, and are never fed here: ipc and loopback peers (:func:`is_local_address`),
  and producers that mapped the shared-memory slab.
* Arrivals of remote batches are grouped into *windows* of at least ``WINDOW_BATCHES`` batches and
  ``WINDOW_S`` seconds, all asked with the current codec (a batch asked before the latest change ends the
  window). A window counts only if the training loop waited for data at least ``STARVED`` of its time: the
  loop was starved, so batches arrived at the pace that producers, link and io thread deliver. Other windows
  (the loop busy with its model, or paused while another loader has its turn) say nothing of that pace and
  are dropped.
* A codec's *rate* is the raw bytes per second of its starved windows since it last became current (the
  latest ``RECENT_WINDOWS``; at least ``RATE_WINDOWS`` of them, ``RATE_S`` seconds in all).
* With a rate for the current codec, a *trial* asks the next codec up the ladder none → lz4 → zstd (or,
  ``RECHECK_S`` after a codec was kept, the one below it again, as conditions change). Going up it is kept
  if it delivers ``GAIN`` times the rate before; going down, if it delivers at least that rate (it costs less
  CPU on both sides). Otherwise the codec before comes back and the tried one is held for ``HOLD_FIRST_S``,
  doubling with each failed trial up to ``HOLD_MAX_S``. A trial whose decompression alone (the io thread's
  own seconds, measured as it decodes its batches after the first) is slower than ``GAIN`` times the rate
  before fails at once, and that codec is not tried again while the rate is still above what the io thread
  decompressed (for up to ``HOLD_MAX_S``): on a fast link the receiver, not the wire, would be the bound. A
  trial that sees ``TRIAL_IDLE_WINDOWS`` windows in which the loop did not starve before it has a rate keeps
  its codec: the loop stopped waiting for data, so the codec costs it nothing.

One decision serves all of a consumer's remote links, not one per link: the loop's wait is the consumer's,
and so are the bottlenecks a codec moves when several producers share them (the trainer's network link,
the io thread that decompresses every batch). Judged per link, a producer that compresses would also
look faster because its neighbours' batches are slowed, not its own.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass
from typing import Iterable

__all__ = ["AutoCodec", "TaskCodecs", "is_local_address", "LADDER"]

#: The codecs "auto" may choose, cheapest first ("none": frames travel raw).
LADDER = ("none", "lz4", "zstd")
#: A window counts when the loop waited for data at least this share of it.
STARVED = 0.5
#: A window closes after at least this many batches (after its first) and this many seconds.
WINDOW_BATCHES, WINDOW_S = 3, 0.2
#: A rate needs this many starved windows and seconds of them; it is taken over the latest RECENT_WINDOWS.
RATE_WINDOWS, RATE_S, RECENT_WINDOWS = 2, 0.5, 8
#: A codec up the ladder is kept only if it delivers this many times the raw rate before.
GAIN = 1.1
#: A trial that sees this many windows in which the loop did not starve, before it has a rate, keeps its codec.
TRIAL_IDLE_WINDOWS = 8
#: A codec that failed its trial is not tried again for HOLD_FIRST_S seconds, doubling up to HOLD_MAX_S.
HOLD_FIRST_S, HOLD_MAX_S = 30.0, 1800.0
#: After a codec was kept, the one below it is tried again after this many seconds.
RECHECK_S = 60.0


def is_local_address(address: str | None) -> bool:
    """True for a peer on this machine, as ZeroMQ reports it (a frame's ``Peer-Address``): a loopback IP, or
    anything that is not an IP at all (ipc reports its peer's credentials, inproc nothing)."""
    text = (address or "").strip().strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return True
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@dataclass
class _Window:
    """Arrivals with ``codec`` since ``start``, when the loop had waited ``waited`` seconds in all."""

    codec: str
    start: float
    waited: float
    batches: int = 0
    raw: int = 0
    wire: int = 0


@dataclass
class _Trial:
    """``codec`` asked instead of ``previous``, which delivered ``baseline`` raw bytes per second."""

    codec: str
    previous: str
    baseline: float
    batches: int = 0  # of ``codec``, arrived since the trial began
    idle: int = 0  # its windows in which the loop did not starve
    raw: int = 0  # of its batches but the first
    decode_s: float = 0.0  # the io thread's seconds decompressing them


class AutoCodec:
    """The codec of one consumer's remote links under ``"auto"`` (see the module docstring).

    Args:
        codecs: the codecs this consumer can decompress; "auto" chooses among them.
    """

    def __init__(self, codecs: Iterable[str]) -> None:
        usable = set(codecs)
        self.ladder = tuple(c for c in LADDER if c == "none" or c in usable)
        self.codec = "none"  # what remote tasks ask for now
        self._window: _Window | None = None
        self._recent: dict[str, deque[tuple[int, int, float]]] = {}  # codec -> (raw, wire, seconds) per window
        self._trial: _Trial | None = None
        self._holds: dict[str, tuple[float, float]] = {}  # codec -> (not tried before, the length of that hold)
        self._decodes: dict[str, tuple[float, float]] = {}  # codec -> (io thread's raw bytes/s, measured when)

    def __repr__(self) -> str:
        trial = f", trying {self._trial.codec} against {self._trial.previous}" if self._trial else ""
        return f"<AutoCodec {self.codec}{trial}>"

    @property
    def trying(self) -> str | None:
        """The codec on trial, or None."""
        return self._trial.codec if self._trial is not None else None

    def rate(self, codec: str) -> float | None:
        """Raw bytes per second ``codec`` delivered while the loop starved, since it last became current; None
        until RATE_WINDOWS windows of RATE_S seconds in all were seen."""
        recent = self._recent.get(codec)
        if not recent or len(recent) < RATE_WINDOWS:
            return None
        seconds = sum(s for _, _, s in recent)
        return sum(r for r, _, _ in recent) / seconds if seconds >= RATE_S else None

    def arrived(self, codec: str, raw: int, wire: int, decode_s: float, now: float, waited: float) -> list[str]:
        """A remote batch arrived at ``now``: ``raw`` bytes once decoded, ``wire`` bytes on the wire, its task
        asked for ``codec``, and the io thread took ``decode_s`` seconds to decompress it. ``waited``: seconds
        the training loop has waited for data in all, until ``now``. Returns lines for the log (decisions)."""
        trial = self._trial
        if trial is not None and codec == trial.codec:
            trial.batches += 1
            if trial.batches > 1:  # the first one pays for first use (fresh memory, the library's own setup)
                trial.raw += raw
                trial.decode_s += decode_s
        if codec != self.codec:  # asked before the latest change: says nothing of the current codec
            self._window = None
            return []
        window = self._window
        if window is None:
            self._window = _Window(codec, now, waited)
        else:
            window.batches += 1
            window.raw += raw
            window.wire += wire
            span = now - window.start
            if window.batches >= WINDOW_BATCHES and span >= WINDOW_S:
                if waited - window.waited >= STARVED * span:
                    self._recent.setdefault(codec, deque(maxlen=RECENT_WINDOWS)).append((window.raw, window.wire, span))
                elif trial is not None:
                    trial.idle += 1
                self._window = _Window(codec, now, waited)
        return self._judge(now) if self._trial is not None else self._maybe_try(now)

    # --- trials -------------------------------------------------------------------------------------------
    def _maybe_try(self, now: float) -> list[str]:
        rate = self.rate(self.codec)
        if rate is None:
            return []
        candidate = self._candidate(now, rate)
        if candidate is None:
            return []
        self._trial = _Trial(candidate, self.codec, rate)
        self._become(candidate)
        return [f"compression: trying {candidate} on the remote links ({self._text(self._trial.previous)} "
                f"delivered {rate / 1e6:.0f} MB/s of raw data while the training loop waited for it)"]

    def _candidate(self, now: float, rate: float) -> str | None:
        """The next codec up the ladder, else the one below, that is not held (nor known to decompress slower
        than ``GAIN`` times ``rate``, the current one's); None if both are."""
        at = self.ladder.index(self.codec)
        for name in (*self.ladder[at + 1 : at + 2], *self.ladder[max(0, at - 1) : at]):
            if now < self._holds.get(name, (0.0, 0.0))[0]:
                continue
            decode, when = self._decodes.get(name, (float("inf"), now))
            if decode < GAIN * rate and now - when < HOLD_MAX_S:
                continue
            return name
        return None

    def _judge(self, now: float) -> list[str]:
        trial = self._trial
        assert trial is not None
        up = self.ladder.index(trial.codec) > self.ladder.index(trial.previous)
        need = GAIN * trial.baseline if up else trial.baseline
        decode = trial.raw / trial.decode_s if trial.batches >= 3 and trial.decode_s > 0 else None
        if decode is not None:
            self._decodes[trial.codec] = (decode, now)
        if up and decode is not None and decode < need:
            return self._fail(now, f"the io thread decompresses only {decode / 1e6:.0f} MB/s of it, against "
                                   f"{trial.baseline / 1e6:.0f} MB/s delivered before")
        rate = self.rate(trial.codec)
        if rate is None:
            if trial.idle < TRIAL_IDLE_WINDOWS:
                return []
            return self._keep(now, "the training loop seldom waited for data during the trial")
        if rate < need:
            return self._fail(now, f"it delivered {rate / 1e6:.0f} MB/s of raw data, against "
                                   f"{trial.baseline / 1e6:.0f} MB/s before")
        return self._keep(now, f"{rate / 1e6:.0f} MB/s of raw data{self._ratio(trial.codec)}, against "
                               f"{trial.baseline / 1e6:.0f} MB/s with {self._text(trial.previous)}")

    def _keep(self, now: float, why: str) -> list[str]:
        trial = self._trial
        assert trial is not None
        self._trial = None
        self._holds.pop(trial.codec, None)
        self._holds[trial.previous] = (now + RECHECK_S, RECHECK_S)  # tried again later: conditions change
        return [f"compression: {self._text(trial.codec)} kept: {why}"]

    def _fail(self, now: float, why: str) -> list[str]:
        trial = self._trial
        assert trial is not None
        self._trial = None
        hold = min(2 * self._holds.get(trial.codec, (0.0, HOLD_FIRST_S / 2))[1], HOLD_MAX_S)
        self._holds[trial.codec] = (now + hold, hold)
        self._become(trial.previous)
        return [f"compression: back to {self._text(trial.previous)}: {self._text(trial.codec)} did not pay ({why}); "
                f"not tried again for {hold:.0f} s"]

    def _become(self, codec: str) -> None:
        """Ask for ``codec`` from now on: its rate is measured afresh, from its first batch."""
        self.codec = codec
        self._window = None
        self._recent.pop(codec, None)

    def _ratio(self, codec: str) -> str:
        recent = self._recent.get(codec) or ()
        raw, wire = sum(r for r, _, _ in recent), sum(w for _, w, _ in recent)
        return f", {raw / wire:.1f}x smaller on the wire" if codec != "none" and wire else ""

    @staticmethod
    def _text(codec: str) -> str:
        return "uncompressed" if codec == "none" else codec


class TaskCodecs:
    """The codec each TASK names (``compression``), and what its batch then tells :class:`AutoCodec`.

    With a fixed codec (``"lz4"``, ``"zstd"``, ``"none"``) every TASK names it. Under ``"auto"`` a local link's
    TASK names none, and a remote link's the current choice, which is noted with the task id so that its batch
    is judged as sent with that codec, however the choice changed meanwhile."""

    def __init__(self, compression: str, codecs: Iterable[str]) -> None:
        self.fixed = compression
        self.auto = AutoCodec(codecs) if compression == "auto" else None
        self._asked: dict[int, str] = {}  # task id -> the codec its TASK named, remote links under "auto"

    def for_task(self, task: int, remote: bool) -> str:
        if self.auto is None:
            return self.fixed
        if not remote:
            return "none"
        self._asked[task] = self.auto.codec
        return self.auto.codec

    def arrived(self, task: int, raw: int, wire: int, decode_s: float, now: float, waited: float) -> list[str]:
        """The batch of ``task`` arrived: what "auto" says of it (log lines), if it judges that task."""
        asked = self._asked.pop(task, None)
        if asked is None or self.auto is None:
            return []
        return self.auto.arrived(asked, raw, wire, decode_s, now, waited)

    @property
    def judged(self) -> dict[int, str]:
        """The tasks whose batches "auto" will judge, with the codec each asked for (a copy)."""
        return dict(self._asked)

    def forget(self, tasks: Iterable[int]) -> None:
        """Tasks that will bring no batch to judge (failed, lost)."""
        for task in tasks:
            self._asked.pop(task, None)

    def clear(self) -> None:
        """A new run: the old run's tasks are forgotten (their late results are duplicates)."""
        self._asked.clear()
