"""Issue 32: the decisions of ferry.ray's manager (ferry/ray/fleet.py), driven as a unit: events in, actions out, the
time passed in. No Ray here (tests/test_ray.py runs the real thing on a cluster)."""

from __future__ import annotations

import logging
import random

import pytest

from ferry.consumer.local.autoscale import ScalePolicy
from ferry.ray.fleet import (
    RESTARTING, SERVING, STARTING, STOPPING, Fleet, Gone, Kill, Log, Serve, Start, Stop,
)


def without_logs(actions):
    return [a for a in actions if not isinstance(a, Log)]


def serving_fleet(count: int, **kwargs) -> Fleet:
    fleet = Fleet(count, count, **kwargs)
    assert without_logs(fleet.scale_to(count, now=0.0)) == [Start(p) for p in range(count)]
    for place in range(count):
        fleet.located(place, f"node{place}:{100 + place}", f"10.0.0.{place}")
    assert [m.state for m in fleet.members.values()] == [SERVING] * count
    return fleet


def test_a_death_tells_the_loader_at_once_and_an_actor_dead_for_good_is_replaced_in_its_place_after_a_back_off():
    fleet = serving_fleet(2)
    actions = fleet.died(0, restarting=False, why="ActorDiedError: killed", now=10.0)
    assert Gone("node0:100", "its Ray actor died: ActorDiedError: killed") == actions[0]
    assert Kill(0) in actions and fleet.count == 2 and fleet.due == {0: 11.0}
    assert fleet.tick(10.9) == []
    assert fleet.tick(11.0) == [Start(0)]
    assert fleet.members[0].state == STARTING and fleet.members[0].name == ""
    # a second death of the same place waits twice as long
    fleet.located(0, "node0:200", "10.0.0.0")
    fleet.died(0, restarting=False, why="again", now=20.0)
    assert fleet.due == {0: 22.0}


def test_a_death_that_ray_restarts_is_told_then_served_again_and_never_replaced():
    fleet = serving_fleet(2)
    actions = fleet.died(1, restarting=True, why="ActorUnavailableError: exit 5", now=5.0)
    assert without_logs(actions) == [Gone("node1:101", "its Ray actor died: ActorUnavailableError: exit 5"), Serve(1)]
    assert fleet.members[1].state == RESTARTING and not fleet.due and fleet.count == 2
    # the calls made while Ray restarts it fail too: asked again, quietly, nothing more told
    assert fleet.died(1, restarting=True, why="ActorUnavailableError: restarting", now=6.0) == [Serve(1)]
    fleet.located(1, "node1:333", "10.0.0.1")
    assert fleet.members[1].state == SERVING and fleet.members[1].name == "node1:333"


def test_a_failure_that_a_restart_repeats_kills_the_actor_and_starts_nothing_any_more():
    fleet = serving_fleet(2)
    actions = fleet.failed(0, "ConfigError: no such dataset")
    assert Kill(0) in actions and Gone("node0:100", "its Ray actor failed: ConfigError: no such dataset") in actions
    assert any(isinstance(a, Log) and a.level == logging.ERROR for a in actions)
    assert fleet.failure == "ConfigError: no such dataset" and fleet.failure_status == 2
    assert fleet.scale_to(2, now=1.0) == [] and fleet.tick(100.0) == []
    assert fleet.died(1, restarting=False, why="x", now=2.0)[-1] == Kill(1) and not fleet.due  # not replaced


def test_scaling_down_stops_the_highest_places_and_what_they_return_is_killed_without_a_replacement():
    fleet = serving_fleet(3)
    fleet.low = 1
    assert fleet.scale_to(1, now=1.0) == [Stop(2), Stop(1)]
    assert fleet.count == 1 and fleet.members[2].state == STOPPING
    assert fleet.returned(2, 0, now=2.0) == [Kill(2)]
    # a stopping actor that dies is not news for the loader: it said BYE
    assert fleet.died(1, restarting=False, why="x", now=2.0) == [Kill(1)]
    assert fleet.count == 1 and not fleet.due and list(fleet.members) == [0]
    # scaled up again: the lowest free places
    assert without_logs(fleet.scale_to(3, now=3.0)) == [Start(1), Start(2)]


def test_close_stops_every_actor_once_and_nothing_starts_after():
    fleet = serving_fleet(2)
    fleet.died(0, restarting=False, why="x", now=1.0)
    assert fleet.close() == [Stop(1)] and not fleet.due
    assert fleet.tick(100.0) == [] and fleet.scale_to(2, now=100.0) == []
    assert fleet.returned(1, 0, now=2.0) == [Kill(1)] and not fleet.members


def test_demand_moves_the_count_with_the_damping_of_local_auto():
    fleet = Fleet(1, 4, policy=ScalePolicy(1, 4))
    fleet.scale_to(1, now=0.0)
    fleet.located(0, "a:1", "n")
    assert fleet.demand(None, now=1.0) == []  # the gauge is not known yet
    assert without_logs(fleet.demand(6, now=6.0)) == [Start(1), Start(2), Start(3)]  # within the bounds
    assert fleet.demand(1, now=30.0) == []  # the other way, within a minute of the change: not yet
    assert without_logs(fleet.demand(1, now=66.0)) == [Stop(3), Stop(2), Stop(1)]


def test_a_noisy_gauge_for_an_hour_never_changes_direction_within_a_minute():
    rng = random.Random(3)
    fleet = Fleet(1, 8, policy=ScalePolicy(1, 8))
    fleet.scale_to(1, now=0.0)
    changes: list[tuple[float, int]] = []
    for step in range(3600):
        now = float(step)
        before = fleet.target
        fleet.demand(rng.randint(1, 8), now)
        if fleet.target != before:
            changes.append((now, 1 if fleet.target > before else -1))
            for place in [p for p, m in fleet.members.items() if m.state == STOPPING]:
                fleet.returned(place, 0, now)
    reversals = [t for (t, d), (_, prev) in zip(changes[1:], changes) if d != prev]
    assert len(changes) > 10
    assert all(b - a >= 60.0 for a, b in zip(reversals, reversals[1:]))
    turns = [(a, b) for (a, da), (b, db) in zip(changes, changes[1:]) if da != db]
    assert all(b - a >= 60.0 for a, b in turns), turns


def test_replacements_stop_after_the_budget_and_say_so():
    fleet = serving_fleet(1)
    now, delays = 0.0, []
    for _ in range(5):  # 5 replacements within the window: 1, 2, 4, 8, 16 s after each death
        fleet.died(0, restarting=False, why="crash", now=now)
        due = fleet.due[0]
        delays.append(due - now)
        assert fleet.tick(due) == [Start(0)]
        fleet.located(0, "a:1", "n")
        now = due + 1.0
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    actions = fleet.died(0, restarting=False, why="crash", now=now)
    assert any(isinstance(a, Log) and a.level == logging.ERROR and "not again" in a.message for a in actions), actions
    assert not fleet.due and fleet.count == 0


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        Fleet(0, 2)
    with pytest.raises(ValueError):
        Fleet(3, 2)
    assert "target 2 of 2..2" in repr(serving_fleet(2))
