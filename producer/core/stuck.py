"""Loads its consumers gave up on, filling every loading thread: the producer takes no work until one returns.

A consumer gives a task up when the producer held it past ``task_timeout`` (or went silent, or said too many
invalid things): it charges that task an attempt and re-issues it elsewhere. Here the task's loads go on, since a
thread inside a dataset's ``__getitem__`` cannot be stopped. If that load never returns (a read from a hung
network mount, a deadlock in a decoder), the thread is lost. Were the producer to say HELLO again at once, as it
did, its consumer would give it new tasks that wait behind the lost thread, time each of them out and charge
each an attempt: batches holding no bad sample end as ``PoisonTaskError``, and the producer is dropped and
re-admitted over and over, stalling the loop each time.

So while the orphaned tasks (:meth:`ferry.producer.core.sharing.Sharing.orphans`) are at least as many as the threads
of the sample pool they load on (one for a dataset class of the user's, ``--threads`` for the pool the built-in
datasets share) or as its ``--slots`` (an orphan holds its slot until it returns, so no new task could start), every
connection that is greeting holds its HELLO (:meth:`ferry.producer.core.connection.Connection.hold`), and the
producer says why at WARNING with the back-off of the "no consumer has answered" warnings (after w, 3w, 6w,
then every 30w: a hold that ends sooner, the usual case of a BYE or a silent consumer as a batch was loading,
says nothing). It takes work again, at once, when one of them returns.

One that never returns needs a fresh process: a producer held for ``--exit-when-stuck`` seconds says why at
ERROR and exits with status 5 (it serves no consumer by then: those that gave up its loads re-issued them)
(:data:`~ferry.producer.exits.EXIT_STUCK`), so that whoever supervises it starts a new one: local mode replaces
it as it replaces any producer that died (a local producer's window is its loader's ``task_timeout``), an
engine by its restart policy. Nothing is lost by it: the consumers gave those loads up already. A pool producer
that still serves another consumer (a job whose dataset loads on other threads) stays, held for the others: its
exit would only interrupt that job. 0 keeps waiting, for a load that may be slow rather than hung.
"""

from __future__ import annotations

import logging
from typing import Any

from ferry.producer.core.actions import Log
from ferry.producer.core.connection import warning_due
from ferry.producer.exits import EXIT_STUCK

__all__ = ["StuckLoads"]


def _describe(job: Any) -> str:
    indices = job.indices
    samples = f"sample {indices[0]}" if len(indices) == 1 else \
        f"samples {indices[0]}..{indices[-1]}" if len(indices) > 2 else f"samples {indices[0]}, {indices[1]}"
    return f"batch {job.seq} of epoch {job.epoch} ({samples})"


class StuckLoads:
    """Whether the producer must hold its HELLOs, from its orphaned tasks, with the log lines that say so.

    Args:
        slots: the tasks the producer runs at once (``--slots``): an orphan holds one until it returns.
        warning_s: the first warning, then with back-off (``FERRY_UNREACHABLE_WARNING_S``). [Unit: second]
        exit_s: a hold this long ends the producer (``--exit-when-stuck``; 0: never). [Unit: second]
    """

    def __init__(self, slots: int, warning_s: float, exit_s: float = 0.0) -> None:
        self.slots = max(1, slots)
        self.warning_s = warning_s
        self.exit_s = exit_s
        self.since: float | None = None  # held since when; None: not held
        self.warnings = 0  # repeats of the warning in this hold
        self.expired = False  # held for exit_s: the producer exits (said once, at ERROR, by update)

    @property
    def held(self) -> bool:
        return self.since is not None

    def full(self, orphans: list[tuple[Any, float]]) -> str | None:
        """What the orphans fill, in words (every thread of a sample pool, or every slot); None: nothing."""
        by_pool: dict[int, list[Any]] = {}
        for job, _ in orphans:
            by_pool.setdefault(id(job.samples), []).append(job)
        for jobs in by_pool.values():
            threads = getattr(jobs[0].samples, "threads", 1)  # a job that never reached a pool: count it as one
            if len(jobs) >= threads:
                return "its one loading thread" if threads == 1 else f"all {threads} of its loading threads"
        if len(orphans) >= self.slots:
            return "its one slot (--slots)" if self.slots == 1 else f"all {self.slots} of its slots"
        return None

    def update(self, orphans: list[tuple[Any, float]], now: float, serving: bool = False) -> list[Log]:
        """The orphaned tasks now, ``(job, started at)`` oldest first; returns what to log. ``serving``: some
        consumer is served still (a pool's other job, on loading threads of its own): the producer does not exit
        while it is. Once expired (the producer exits), nothing more."""
        if self.expired:
            return []
        what = self.full(orphans)
        if what is None:
            if self.since is None:
                return []
            held_s, warned, self.since = now - self.since, self.warnings > 0, None
            if not warned:  # the usual case: a consumer said BYE or went silent as a batch was loading
                return []
            return [Log(logging.INFO, f"a load given up on by its consumer returned after {held_s:.0f} s of holding "
                                      "back: taking work again", {"event": "unstuck", "held_s": round(held_s, 1)})]
        if self.since is None:
            self.since, self.warnings = now, 0
        if self.exit_s and now - self.since >= self.exit_s and not serving:
            self.expired = True
            return [self._farewell(orphans, what, now)]
        if now - self.since > warning_due(self.warning_s, self.warnings):
            self.warnings += 1
            return [self._warning(orphans, what, now)]
        return []

    @staticmethod
    def _warning(orphans: list[tuple[Any, float]], what: str, now: float) -> Log:
        return _said(logging.WARNING, orphans, now, f"and holding {what}: taking no work until one returns (the "
                     "dataset's __getitem__ may hang on a sample of it; restart this producer if it never returns)",
                     event="stuck")

    def _farewell(self, orphans: list[tuple[Any, float]], what: str, now: float) -> Log:
        return _said(logging.ERROR, orphans, now, f"and holding {what} for {now - self.since:.0f} s "
                     f"(--exit-when-stuck {self.exit_s:g}): exiting with status {EXIT_STUCK}, so that a fresh process "
                     "takes this one's place (the dataset's __getitem__ hangs on a sample of it)",
                     event="stuck_exit", exit_code=EXIT_STUCK)


def _said(level: int, orphans: list[tuple[Any, float]], now: float, rest: str, **fields: Any) -> Log:
    """A line about the orphans, oldest first: its batch, how many more, how long it has loaded, then ``rest``."""
    job, started = orphans[0]
    others = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
    return Log(level, f"{_describe(job)}{others}, given up on by the consumer, still loading after "
                      f"{now - started:.0f} s {rest}",
               {"event": fields.pop("event"), "loading_s": round(now - started, 1), "orphans": len(orphans),
                "epoch": job.epoch, "seq": job.seq, **fields})
