"""A producer's work across the consumers it serves (docs/ARCHITECTURE.md#producer): which dataset each connection
is bound to (:mod:`ferry.producer.loading.pool`), whose TASK runs next (:mod:`ferry.producer.core.fairshare`), and the per-job
figures of the producer's metrics. Only the main loop (:mod:`ferry.producer.io.service`) uses a :class:`Sharing`; it
touches no socket.

Per job (one consumer connection), the figures say: its ``weight``; its *demand* here, tasks ``queued`` and
``running``, and the demand its consumer reports in its PINGs (``needed``: the producers its loop needs,
consumer/figures/demand.py); its *share*, ``served_s`` (producer seconds its tasks took; a share is its rate over
the rate of all jobs'); its *stall*, its loop's fraction of time waiting for data as its consumer reports it
(``stall``), and ``waited_s``, the seconds its tasks waited here for a worker. ``pool_demand`` is the sum of the
jobs' ``needed``: the producers the whole pool needs, for an engine's autoscaler (docs/deployment.md).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ferry.common.pool import dataset_key

from ferry.producer.core.actions import Action, OpenDataset
from ferry.producer.loading.batcher import Job
from ferry.producer.core.fairshare import FairShare
from ferry.producer.io.links import Link
from ferry.producer.loading.pool import DatasetPool, DatasetRefused, Served

__all__ = ["Sharing"]


#: The largest figure a consumer's PING may report (a hostile one must not make the pool's demand infinite).
_MAX_REPORTED = 1e6


def _number(value: Any) -> float:
    """A figure a consumer reported (a PING's load), as a number in [0, _MAX_REPORTED]; 0 for anything else."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= _MAX_REPORTED:
        return 0.0
    return float(value)


class Sharing:
    """The datasets (``datasets``, a DatasetPool) and the fair scheduler (``share``, at most ``limit`` tasks at once).

    Args:
        datasets: the producer's opened datasets.
        limit: tasks run at once, across every consumer (``--slots``).
    """

    def __init__(self, datasets: DatasetPool, *, limit: int) -> None:
        self.datasets = datasets
        self.share = FairShare(limit=limit)

    # --- connections and their datasets -----------------------------------------------------------------
    def bind_link(self, link: Link, opened: bool) -> None:
        """A new connection serves the producer's own dataset (if any) until its consumer names another; a closed
        one no longer holds its dataset, and its queued tasks are dropped."""
        if opened:
            own = self.datasets.own
            self.datasets.bind(None, own)
            link.served = own
            link.conn.dataset_len = own.index_bound if own is not None else 0
            return
        self.datasets.bind(link.served, None)
        link.served = None
        self.share.forget(link.key)

    def bind_dataset(self, link: Link, action: OpenDataset, now: float) -> list[Action]:
        """A consumer named its dataset in its WELCOME (a pool, common/pool.py): bind the connection to it if it is
        open; else it opens off the main loop and :meth:`opened` binds it. Returns the connection's actions: its next
        HELLO announces the dataset, or why it may not be served (none while it opens)."""
        try:
            served = self.datasets.request(action.spec, action.args)
        except DatasetRefused as exc:
            return self._refuse(link, exc, now)
        if served is None:  # opening: the connection stays GREETING, its consumer's repeated naming changes nothing
            link.opening = dataset_key(action.spec, action.args)
            return []
        return self._bind(link, served, now)

    def opened(self, links: Iterable[Link], now: float) -> list[tuple[Link, list[Action]]]:
        """The datasets whose opening ended: each connection waiting for one is bound to it (or told why not).
        Returns each such connection with its actions."""
        finished = dict(self.datasets.opened())
        answers = []
        for link in links:
            result = finished.get(link.opening) if link.opening is not None else None
            if result is None:
                continue
            answers.append((link, self._refuse(link, result, now) if isinstance(result, DatasetRefused)
                            else self._bind(link, result, now)))
        return answers

    def _bind(self, link: Link, served: Served, now: float) -> list[Action]:
        self.datasets.bind(link.served, served)
        link.served, link.hello_extra, link.opening = served, {"dataset": served.announce}, None
        return link.conn.dataset_bound(served.index_bound, None, now)

    def _refuse(self, link: Link, why: DatasetRefused, now: float) -> list[Action]:
        link.hello_extra, link.opening = {"refused": str(why)}, None
        return link.conn.dataset_bound(0, str(why), now)

    # --- tasks ---------------------------------------------------------------------------------------------
    def submit(self, link: Link, job: Job, now: float) -> None:
        """Queue ``job``: its turn comes by its consumer's weight (its WELCOME's) against the others'."""
        self.share.add(link.key, link.weight, job, now)

    def start(self, link_of: Callable[[int], Link | None], now: float) -> None:
        """Hand the batcher of each one's dataset the tasks whose turn it is. A task whose connection is gone or left
        its session is dropped: its consumer re-issues it."""
        for key, job in self.share.take(now):
            link = link_of(key)
            served = link.served if link is not None else None
            if link is None or served is None or not link.conn.owns(job.session):
                self.share.finished(job, now)
                continue
            job.samples = served.batcher.samples  # which loading threads its loads fill (producer/core/stuck.py)
            served.batcher.submit(job)

    def finished(self, job: Job, now: float) -> None:
        """``job``'s outcome is back: its worker is free, its consumer pays what it cost."""
        self.share.finished(job, now)

    def orphans(self, link_of: Callable[[int], Link | None]) -> list[tuple[Job, float]]:
        """The running tasks whose consumer gave them up (their connection left that session, or is gone), each
        with when it started, oldest first: their loads go on, as a thread cannot be stopped (producer/core/stuck.py)."""
        orphaned = []
        for key, job, at in self.share.started():
            link = link_of(key)
            if link is None or not link.conn.owns(job.session):
                orphaned.append((job, at))
        return orphaned

    @property
    def pending(self) -> int:
        """Tasks received and not yet finished: waiting for their turn, or handed to a batcher."""
        return self.datasets.pending + sum(len(flow.queue) for flow in list(self.share.flows.values()))

    # --- figures ---------------------------------------------------------------------------------------------
    def figures(self, links: Iterable[Link]) -> dict[str, Any]:
        """``per_job`` (by consumer endpoint, for each serving connection) and ``pool_demand``: see the module
        docstring. Any thread may ask (the metrics server's): it reads copies, and plain numbers."""
        flows = self.share.figures()
        jobs = {}
        for link in list(links):  # a copy made at once: the metrics thread reads while the loop changes them
            if not link.conn.serving:
                continue
            flow = flows.get(link.key, {})
            jobs[link.conn.endpoint] = {
                "weight": link.weight, "queued": flow.get("queued", 0), "running": flow.get("running", 0),
                "served_s": flow.get("served_s", 0.0), "waited_s": flow.get("waited_s", 0.0),
                "tasks": flow.get("tasks", 0), "needed": _number(link.load.get("needed")),
                "stall": _number(link.load.get("stall")),
                "dataset": link.served.announce["spec"] if link.served is not None else ""}
        return {"per_job": jobs, "pool_demand": sum(job["needed"] for job in jobs.values())}

    def close(self) -> None:
        """Stop every dataset's batcher (see DatasetPool.close)."""
        self.datasets.close()
