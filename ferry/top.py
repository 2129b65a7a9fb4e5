"""``ferry top``: the jobs a producer pool serves, refreshed in a terminal (docs/deployment.md#one-pool-several-jobs).

It reads each producer's metrics endpoint (``--metrics-port``; the per-job figures of producer/core/sharing.py), and
shows per job, over the pool: its weight, its *share* of the pool's producer time over the last interval (its
served seconds' rate over every job's), its batches a second, its *demand* (the producers its loop needs, as its
PINGs report; and its tasks queued and running now), its *stall* (the fraction of time its loop waits for data),
and the pool's demand: the sum of its jobs'. Plain HTTP and text: no torch, no zmq.

    ferry top http://producer-1:9100 http://producer-2:9100 [--interval 2] [--once]
"""

from __future__ import annotations

import argparse
import sys
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable

__all__ = ["add_arguments", "run", "parse_jobs", "rows", "render", "why_silent", "FETCH_TIMEOUT_S"]

_PREFIX = "ferry_producer_job_"
#: How long one producer's metrics endpoint has to answer a reading. [Unit: second]
FETCH_TIMEOUT_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL",
                        help="a producer's metrics endpoint, http://HOST:PORT (its --metrics-port)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between two readings (a share is measured over one) (default 2)")
    parser.add_argument("--once", action="store_true", help="print one table (two readings an interval apart) and exit")
    parser.add_argument("--count", type=int, default=0, metavar="N",
                        help="stop after N tables; 0: until Ctrl-C (default)")


def parse_jobs(text: str) -> dict[str, dict[str, Any]]:
    """The per-job figures in one producer's Prometheus text: job -> {figure: value, "dataset": name}."""
    jobs: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIX) or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        labels_text, _, value = rest.rpartition("}")
        labels = dict(_label(item) for item in _split_labels(labels_text))
        field = name[len(_PREFIX):].removesuffix("_total")
        try:
            number = float(value.split()[0])
        except (ValueError, IndexError):
            continue
        job = jobs.setdefault(labels.get("job", "?"), {"dataset": labels.get("dataset", "")})
        job[field] = number
    return jobs


def _split_labels(text: str) -> list[str]:
    """``a="x",b="y,z"`` -> ``['a="x"', 'b="y,z"']`` (commas inside quotes kept)."""
    items, current, quoted = [], "", False
    for char in text:
        if char == '"' and not current.endswith("\\"):
            quoted = not quoted
        if char == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in items + [current] if item]


def _label(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")
    return key.strip(), value.strip().strip('"')


def rows(before: list[dict[str, dict[str, Any]]], after: list[dict[str, dict[str, Any]]],
         seconds: float) -> tuple[list[dict[str, Any]], float]:
    """Per job over the pool, from two readings of every producer ``seconds`` apart: weight, share (of the served
    seconds' increase), tasks/s, needed, queued, running, stall. Returns the rows (largest share first) and the
    pool's demand (the sum of its jobs' needed)."""
    jobs: dict[str, dict[str, Any]] = {}
    for old, new in zip(before, after):
        for name, figures in new.items():
            job = jobs.setdefault(name, {"job": name, "dataset": figures.get("dataset", ""), "weight": 0.0,
                                         "served": 0.0, "tasks": 0.0, "needed": 0.0, "queued": 0.0, "running": 0.0,
                                         "stall": 0.0})
            previous = old.get(name, {})
            job["served"] += max(0.0, figures.get("served_s", 0.0) - previous.get("served_s", 0.0))
            job["tasks"] += max(0.0, figures.get("tasks", 0.0) - previous.get("tasks", 0.0))
            job["queued"] += figures.get("queued", 0.0)
            job["running"] += figures.get("running", 0.0)
            # told by the job to every producer alike: the same value, or 0 where not told yet
            for field in ("weight", "needed", "stall"):
                job[field] = max(job[field], figures.get(field, 0.0))
    total = sum(job["served"] for job in jobs.values())
    for job in jobs.values():
        job["share"] = job["served"] / total if total > 0 else 0.0
        job["tasks_per_s"] = job["tasks"] / seconds if seconds > 0 else 0.0
    ordered = sorted(jobs.values(), key=lambda job: (-job["share"], job["job"]))
    return ordered, sum(job["needed"] for job in ordered)


def render(table: list[dict[str, Any]], demand: float, producers: int, answered: int, seconds: float,
           silent: list[tuple[str, str]] | None = None) -> str:
    """The table as text; ``silent``: the producers that did not answer, as ``(url, why)``, named under the header."""
    lines = [f"ferry top: {answered}/{producers} producers answered, {len(table)} jobs, pool demand "
             f"{demand:g} producers, share over {seconds:.1f} s"]
    if silent:
        lines.append("not answering: " + ", ".join(f"{url} ({why})" for url, why in silent))
    lines += [
             f"{'JOB':<32} {'DATASET':<20} {'WEIGHT':>6} {'SHARE':>6} {'BATCH/S':>8} {'NEEDED':>6} "
             f"{'QUEUED':>6} {'RUN':>4} {'STALL':>6}"]
    for job in table:
        lines.append(f"{job['job'][:32]:<32} {job['dataset'][:20]:<20} {job['weight']:>6g} {100 * job['share']:>5.1f}%"
                     f" {job['tasks_per_s']:>8.1f} {job['needed']:>6g} {job['queued']:>6g} {job['running']:>4g}"
                     f" {100 * job['stall']:>5.1f}%")
    return "\n".join(lines)


def _read_all(urls: list[str], fetch: Callable[[str], str]) -> tuple[list[dict[str, dict[str, Any]]],
                                                                     list[tuple[str, str]]]:
    """One reading of every producer (``{}`` for one that did not answer), and those that did not, as ``(url,
    why)``."""
    readings, silent = [], []
    for url in urls:
        try:
            readings.append(parse_jobs(fetch(url)))
        except OSError as exc:  # a producer that does not answer (gone, restarting): left out of this reading
            readings.append({})
            silent.append((url, why_silent(exc)))
    return readings, silent


def why_silent(exc: OSError) -> str:
    """Why a producer's metrics endpoint did not answer, in a few words: ``timed out after 5 s``, ``connection
    refused``, ``host not found``, ``HTTP 404 Not Found``..."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}".strip()
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):  # socket.timeout too
        return f"timed out after {FETCH_TIMEOUT_S:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    if isinstance(reason, socket.gaierror):
        return f"host not found ({reason.strerror})" if reason.strerror else "host not found"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason) or type(reason).__name__
    return str(reason) or type(exc).__name__


def _fetch(url: str) -> str:
    url = url if "://" in url else f"http://{url}"
    url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
        return answer.read().decode()


def run(args: argparse.Namespace, fetch: Callable[[str], str] = _fetch, out: Any = None) -> int:
    """Print a table every ``--interval`` seconds (redrawn in place on a terminal) until Ctrl-C, ``--count`` tables
    or, with ``--once``, one. Returns 0, or 1 when no producer ever answered."""
    out = out or sys.stdout
    if args.interval <= 0:
        print("ferry top: error: --interval must be above 0", file=sys.stderr)
        return 2
    redraw = out.isatty()
    limit = 1 if args.once else args.count
    before, silent = _read_all(args.urls, fetch)
    answered_any = len(silent) < len(args.urls)
    shown = 0
    try:
        while not limit or shown < limit:
            began = time.monotonic()
            time.sleep(args.interval)  # the interval a share is measured over (a refresh, not a wait for a thing)
            after, silent = _read_all(args.urls, fetch)
            answered = len(args.urls) - len(silent)
            answered_any = answered_any or answered > 0
            table, demand = rows(before, after, time.monotonic() - began)
            text = render(table, demand, len(args.urls), answered, time.monotonic() - began, silent)
            out.write(("\x1b[H\x1b[J" if redraw else "") + text + "\n")
            out.flush()
            before, shown = after, shown + 1
    except KeyboardInterrupt:
        pass
    return 0 if answered_any else 1
