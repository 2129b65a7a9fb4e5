"""The producer's weighted fair scheduler (producer/core/fairshare.py) without threads: a simulated producer whose
workers finish tasks at simulated times, consumers whose demand the test controls."""

from __future__ import annotations

import heapq

import pytest

from ferry.producer.core.fairshare import FairShare


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def simulate(share: FairShare, flows: dict[int, tuple[float, float]], until: float, *, backlog: int = 2,
             active=lambda flow, now: True) -> dict[int, float]:
    """Run ``share`` to ``until`` s: flow -> (weight, seconds per task); each active flow keeps ``backlog`` tasks
    queued or running (a consumer's credits at this producer). Returns each flow's producer seconds."""
    now, running, outstanding, ids = 0.0, [], {f: 0 for f in flows}, iter(range(10 ** 9))

    def top_up() -> None:
        for flow, (weight, _) in flows.items():
            while active(flow, now) and outstanding[flow] < backlog:
                share.add(flow, weight, (flow, next(ids)), now)
                outstanding[flow] += 1
        for flow, item in share.take(now):
            heapq.heappush(running, (now + flows[flow][1], item[1], item))

    top_up()
    while running and now < until:
        now, _, item = heapq.heappop(running)
        share.finished(item, now)
        outstanding[item[0]] -= 1
        top_up()
    return {flow: f["served_s"] for flow, f in share.figures().items()}


def test_demand_over_the_producer_is_shared_by_weight_whatever_each_tasks_cost():
    # weights 1:1:2; the heavy flow's tasks cost half as much, the first's twice as much
    served = simulate(FairShare(limit=2), {1: (1.0, 0.2), 2: (1.0, 0.1), 3: (2.0, 0.05)}, until=200.0)
    total = sum(served.values())
    for flow, weight in ((1, 1), (2, 1), (3, 2)):
        assert served[flow] / total == pytest.approx(weight / 4, rel=0.02), served


def test_equal_weights_give_equal_time_jain_index_near_one():
    served = simulate(FairShare(limit=2), {1: (1.0, 0.03), 2: (1.0, 0.07), 3: (1.0, 0.11)}, until=100.0)
    assert jain(list(served.values())) >= 0.99, served


def test_a_flow_that_asks_less_than_its_share_leaves_the_rest_to_the_others():
    # flow 3 (weight 2) keeps one task at a time on 4 workers: it gets what it asks for, the others the rest
    share = FairShare(limit=4)
    served = simulate(share, {1: (1.0, 0.1), 2: (1.0, 0.1), 3: (2.0, 0.1)}, until=100.0, backlog=1)
    assert sum(served.values()) == pytest.approx(3 * 100.0, rel=0.02)  # every worker it could use stayed busy


def test_a_flow_away_for_a_while_banks_no_credit_when_it_returns():
    share = FairShare(limit=1)
    served = simulate(share, {1: (1.0, 0.1), 2: (1.0, 0.1)}, until=100.0,
                      active=lambda flow, now: flow == 1 or now >= 50.0)
    # flow 2 came back at 50 s: it then shares equally, it does not take the producer for 50 s to catch up
    assert served[2] == pytest.approx(25.0, rel=0.05) and served[1] == pytest.approx(75.0, rel=0.05)


def test_at_most_limit_tasks_run_and_a_flows_tasks_start_in_their_order():
    share = FairShare(limit=2)
    items = [["a", i] for i in range(5)]  # told apart by identity
    for item in items:
        share.add(7, 1.0, item, 0.0)
    started = share.take(0.0)
    assert [item for _, item in started] == [["a", 0], ["a", 1]] and share.take(0.0) == []
    share.finished(["a", 0], 1.0)  # an equal object that is not the one started: ignored
    assert share.take(1.0) == []
    share.finished(items[0], 1.0)
    assert [item for _, item in share.take(1.0)] == [["a", 2]]
    assert share.figures()[7]["queued"] == 2 and share.figures()[7]["waited_s"] == pytest.approx(1.0)


def test_a_forgotten_flow_drops_its_queue_and_frees_its_running_workers_when_they_end():
    share = FairShare(limit=1)
    share.add(1, 1.0, "x", 0.0)
    share.add(1, 1.0, "y", 0.0)
    assert share.take(0.0) == [(1, "x")]
    assert share.forget(1) == ["y"]
    share.finished("x", 1.0)
    assert share.running == 0 and share.take(1.0) == [] and 1 not in share.figures()
    assert "0/1 running" in repr(share)
