"""deploy/grafana/ferry-dashboard.json: valid JSON, and every metric its queries name is one the loader exports,
so the dashboard cannot drift from the figures (consumer/figures/counters.py: STATS)."""

import json
import os
import re

from ferry.common.metrics import COUNTER
from ferry.consumer.figures.counters import STATS

from .helpers import REPO

PREFIX = "ferry_consumer"


def exported_names() -> set[str]:
    names = set()
    for figure in STATS:
        if figure.kind is None:
            continue
        suffix = "_total" if figure.kind == COUNTER else ""
        names.add(f"{PREFIX}_{figure.name}{suffix}")
        if figure.also:
            names.add(figure.also + suffix)
    return names


def test_every_query_of_the_dashboard_names_an_exported_metric():
    with open(os.path.join(REPO, "deploy", "grafana", "ferry-dashboard.json")) as f:
        dashboard = json.load(f)
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    named = {name for q in queries for name in re.findall(r"\bferry_[a-z_]+", q)}
    assert {"ferry_producers_needed", "ferry_producers_connected", "ferry_stall_fraction"} <= named
    assert named <= exported_names(), named - exported_names()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
