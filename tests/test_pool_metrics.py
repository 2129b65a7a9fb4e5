"""A pool producer's per-job figures on its metrics endpoint (producer/core/sharing.py), with real processes: each job's
weight, share (seconds served), demand (its loop's demand gauge, from its PINGs) and stall, and the pool's demand,
the sum of its jobs'."""

from __future__ import annotations

import urllib.request

from tests.helpers import wait_for
from tests.pool_jobs import Job, job_figures, spawn_pool


def pool_demand(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("ferry_pool_demand "))


def test_each_job_s_share_demand_and_stall_and_the_pools_demand_are_exported(spawn):
    light, heavy = Job(1.0), Job(3.0)
    jobs = [light, heavy]
    try:
        producers = spawn_pool(spawn, jobs, count=2, metrics=True)
        for job in jobs:
            job.start()

        def reported() -> bool:  # every producer has each job's demand as that job's loader computes it now
            needed = [job.loader.stats()["producers_needed"] for job in jobs]
            if None in needed:
                return False
            return all(job_figures(p.metrics_port).get(job.endpoint, {}).get("needed") == n
                       for p in producers for job, n in zip(jobs, needed))

        wait_for(reported, 60, "each job's demand gauge reaching every producer")
        for producer in producers:
            figures = job_figures(producer.metrics_port)
            assert {figures[job.endpoint]["weight"] for job in jobs} == {1.0, 3.0}
            assert all(figures[job.endpoint]["needed"] >= 1 for job in jobs)  # the loops wait: they want more
            assert all(figures[job.endpoint]["stall"] > 0.5 for job in jobs)  # ... and stall most of the time
            # both were served (how much, by weight, is tests/test_fair_shares.py's question)
            assert all(figures[job.endpoint]["served_s"] > 0 and figures[job.endpoint]["tasks"] > 0 for job in jobs)
            assert pool_demand(producer.metrics_port) == sum(figures[job.endpoint]["needed"] for job in jobs)
    finally:
        for job in jobs:
            job.close()
