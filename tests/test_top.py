"""``ferry top`` (ferry/top.py): the per-job figures of a pool's producers, read, summed over the pool and shown;
on made-up metrics text, then on real producers."""

from __future__ import annotations

import io
import re
import socket
import urllib.error
import subprocess
import sys
from types import SimpleNamespace

import ferry.top
from ferry.top import parse_jobs, render, rows, run, why_silent
from tests.helpers import REPO, producer_env, wait_for
from tests.pool_jobs import Job, spawn_pool


def metrics(served: dict[str, float], needed: float = 2.0) -> str:
    lines = []
    for job, seconds in served.items():
        labels = f'{{dataset="synthetic",job="{job}"}}'
        lines += [f"ferry_producer_job_served_s_total{labels} {seconds}", f"ferry_producer_job_tasks_total{labels} 10",
                  f"ferry_producer_job_weight{labels} 2.0", f"ferry_producer_job_needed{labels} {needed}",
                  f"ferry_producer_job_queued{labels} 1.0", f"ferry_producer_job_stall{labels} 0.25"]
    return "\n".join(["# HELP ferry_producer_batches_sent_total x", "ferry_producer_batches_sent_total 3.0", *lines])


def test_shares_are_the_increase_of_served_seconds_summed_over_the_producers():
    before = [parse_jobs(metrics({"tcp://a:1": 1.0, "tcp://b:2": 1.0})), parse_jobs(metrics({"tcp://a:1": 0.0}))]
    after = [parse_jobs(metrics({"tcp://a:1": 2.0, "tcp://b:2": 3.0})), parse_jobs(metrics({"tcp://a:1": 1.0}))]
    table, demand = rows(before, after, seconds=2.0)
    assert [(r["job"], round(r["share"], 3)) for r in table] == [("tcp://a:1", 0.5), ("tcp://b:2", 0.5)]
    a = table[0]
    assert a["queued"] == 2.0 and a["weight"] == 2.0 and a["needed"] == 2.0 and a["stall"] == 0.25
    assert demand == 4.0  # two jobs needing 2 producers each
    text = render(table, demand, producers=2, answered=2, seconds=2.0)
    assert "2/2 producers answered, 2 jobs, pool demand 4 producers" in text
    assert re.search(r"tcp://a:1\s+synthetic\s+2\s+50.0%", text)


def test_a_producer_that_does_not_answer_is_left_out_and_none_answering_is_an_error():
    def fetch(url: str) -> str:
        if "down" in url:
            raise OSError("connection refused")
        return metrics({"tcp://a:1": 1.0})

    out = io.StringIO()
    args = SimpleNamespace(urls=["http://up:1", "http://down:2"], interval=0.01, once=True, count=0)
    assert run(args, fetch=fetch, out=out) == 0 and "1/2 producers answered" in out.getvalue()
    assert "not answering: http://down:2 (connection refused)" in out.getvalue()
    args.urls = ["http://down:2"]
    assert run(args, fetch=fetch, out=io.StringIO()) == 1


def test_the_producers_that_do_not_answer_are_named_with_why():
    errors = {"http://a:1": urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
              "http://b:2": urllib.error.URLError(TimeoutError("timed out")),
              "http://c:3": TimeoutError("timed out"),  # urlopen raises a read's timeout bare
              "http://d:4": urllib.error.URLError(socket.gaierror(-2, "Name or service not known")),
              "http://e:5": urllib.error.HTTPError("http://e:5/metrics", 404, "Not Found", None, None)}
    assert {url: why_silent(exc) for url, exc in errors.items()} == {
        "http://a:1": "connection refused", "http://b:2": "timed out after 5 s", "http://c:3": "timed out after 5 s",
        "http://d:4": "host not found (Name or service not known)", "http://e:5": "HTTP 404 Not Found"}
    text = render([], 0.0, producers=3, answered=1, seconds=1.0,
                  silent=[("http://a:1", "connection refused"), ("http://b:2", "timed out after 5 s")])
    assert text.splitlines()[:2] == [
        "ferry top: 1/3 producers answered, 0 jobs, pool demand 0 producers, share over 1.0 s",
        "not answering: http://a:1 (connection refused), http://b:2 (timed out after 5 s)"]
    assert "not answering" not in render([], 0.0, producers=1, answered=1, seconds=1.0)


def test_real_endpoints_that_refuse_or_never_answer_are_named_with_why(monkeypatch):
    """Real sockets: a port nobody listens on refuses; one that accepts and never answers times out."""
    monkeypatch.setattr(ferry.top, "FETCH_TIMEOUT_S", 0.3)
    with socket.socket() as closed, socket.socket() as mute:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)  # the kernel accepts; nobody ever reads or answers
        urls = [f"http://127.0.0.1:{closed.getsockname()[1]}", f"127.0.0.1:{mute.getsockname()[1]}"]
        out = io.StringIO()
        args = SimpleNamespace(urls=urls, interval=0.01, once=True, count=0)
        assert run(args, out=out) == 1  # none answered
    assert "0/2 producers answered" in out.getvalue()
    assert f"not answering: {urls[0]} (connection refused), {urls[1]} (timed out after 0.3 s)" in out.getvalue()


def test_ferry_top_shows_each_job_of_a_real_pool(spawn):
    jobs = [Job(1.0), Job(3.0)]
    try:
        producers = spawn_pool(spawn, jobs, count=2, metrics=True)
        for job in jobs:
            job.start()
        wait_for(lambda: all(job.batches >= 10 for job in jobs), 60, "both jobs served")
        urls = [f"http://127.0.0.1:{p.metrics_port}" for p in producers]
        done = subprocess.run([sys.executable, "-m", "ferry", "top", "--once", "--interval", "1", *urls], cwd=REPO,
                              env=producer_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "2/2 producers answered, 2 jobs" in done.stdout
        shares = [float(m) for m in re.findall(r"([\d.]+)%\s+[\d.]+\s+\S+\s+\S+\s+\S+\s+[\d.]+%$", done.stdout, re.M)]
        assert all(job.endpoint in done.stdout for job in jobs) and abs(sum(shares) - 100) < 0.5, done.stdout
    finally:
        for job in jobs:
            job.close()
