"""``local_producers="auto"`` (issue 19, part 2): local producers started and stopped from the demand gauge.

The policy (consumer/local/autoscale.py) as a unit, with the time passed in: at most one change per control
period, a change against the last one's direction only a minute after it, the bounds. The options and their
errors. A process-level test of the mechanics, fast, in the default suite: scaling up starts producers in fresh
places with fresh seeds, scaling down stops producers in an orderly way (BYE: with ``max_attempts=1`` a task
charged for it would poison its batch), they are not replaced, and the epoch stays exactly once and in order.
The measurement (marked ``slow``: about 80 s) runs the real control loop against sleeping producers and a
sleeping step, and checks the figures the issue states, comparing every batch with torch's DataLoader.
"""

from __future__ import annotations

import os
import random
import re
import time

import pytest
import torch

from ferry import ConfigError, ConfigTypeError, LocalOptions, RemoteLoader
from ferry.common.constants import AUTOSCALE_PERIOD_S, AUTOSCALE_REVERSAL_S
from ferry.consumer.local import autoscale
from ferry.consumer.local.autoscale import ScalePolicy, count_bounds

from tests.datasets import PairDataset
from tests.lifecycle_datasets import SeedDataset

from .helpers import (FullLeakCheck, assert_tree_equal, describe_local_producers, local_producer_pids,
                      reference_batches, scale_local_producers, wait_for)

MASK = (1 << 63) - 1
#: The producers here sleep, so more of them than CPUs is the point: the warning of excessive producers (a max above
#: the CPUs of a small machine) is expected.
SLEEPERS = "ignore:This RemoteLoader may start up to:UserWarning"


# --- the policy, as a unit ------------------------------------------------------------------------------------
def test_the_first_value_of_the_gauge_is_acted_on_at_once_within_the_bounds():
    policy = ScalePolicy(1, 4)
    assert policy.decide(0.0, 1, None) is None  # the gauge knows nothing yet
    assert policy.decide(5.0, 1, 3) == 3
    assert ScalePolicy(1, 4).decide(5.0, 1, 9) == 4  # capped at high
    assert ScalePolicy(2, 4).decide(5.0, 3, 1) == 2  # never below low
    assert ScalePolicy(1, 4).decide(5.0, 3, 3) is None  # already there


def test_the_count_changes_at_most_once_per_control_period():
    policy = ScalePolicy(1, 8, period=5.0, reversal=60.0)
    assert policy.decide(10.0, 1, 3) == 3
    assert policy.decide(14.9, 3, 5) is None  # same direction, but within the period
    assert policy.decide(15.0, 3, 5) == 5


def test_a_change_against_the_last_one_waits_a_minute_after_it():
    policy = ScalePolicy(1, 8, period=5.0, reversal=60.0)
    assert policy.decide(10.0, 1, 4) == 4
    for now in (15.0, 30.0, 69.9):
        assert policy.decide(now, 4, 1) is None, now
    assert policy.decide(70.0, 4, 1) == 1
    assert policy.decide(75.0, 1, 4) is None  # up again: another minute
    assert policy.decide(130.0, 1, 4) == 4


def test_a_noisy_gauge_changes_the_direction_at_most_once_a_minute():
    rng = random.Random(19)
    policy = ScalePolicy(1, 6)
    count, changes, now = 1, [], 0.0
    for _ in range(20000):  # about 5.5 hours of samples a second, the gauge jumping around
        now += 1.0
        target = policy.decide(now, count, rng.choice([None, 1, 2, 3, 4, 5, 6, 7]))
        if target is not None:
            changes.append((now, 1 if target > count else -1))
            count = target
    reversals = [t for (t, d), (_, before) in zip(changes[1:], changes) if d != before]
    assert len(changes) > 50 and len(reversals) > 20, "the noise should have made it move"
    assert all(b - a >= AUTOSCALE_REVERSAL_S for a, b in zip(reversals, reversals[1:])), reversals
    assert all(b - a >= AUTOSCALE_PERIOD_S for (a, _), (b, _) in zip(changes, changes[1:]))


def test_the_control_period_is_the_gauge_s_window_and_the_reversal_a_minute():
    from ferry.consumer.figures.demand import WINDOW_S

    assert AUTOSCALE_PERIOD_S == WINDOW_S and AUTOSCALE_REVERSAL_S == 60.0


class _Producers:
    """What the autoscaler reads and calls of a LocalProducers: the count and its bounds, and scale_to."""

    def __init__(self, count: int, low: int, high: int) -> None:
        self.count, self.low, self.high = count, low, high
        self.asked: list[int] = []

    def scale_to(self, count: int) -> None:
        self.asked.append(count)
        self.count = count


def test_a_need_above_the_bound_is_said_once_naming_the_bound_and_where_it_comes_from(caplog, monkeypatch):
    """On a 2-CPU machine the default bound is 1: "auto" stays at one producer, and says why, once."""
    monkeypatch.setattr(autoscale, "usable_cpus", lambda: 2)
    producers = _Producers(count=1, low=1, high=1)
    scaler = autoscale.Autoscaler(producers, default_high=True)
    with caplog.at_level("INFO", logger="ferry.consumer"):
        for second in range(3):
            scaler(100.0 + 10 * second, 5)
    said = [r.getMessage() for r in caplog.records if "at most" in r.getMessage()]
    assert len(said) == 1, said
    assert "needs about 5 local producers" in said[0] and "at most 1 run here" in said[0], said
    assert "2 CPUs" in said[0] and "local_producers_max raises it" in said[0], said
    assert producers.asked == []  # nothing to change: it is at its bound
    caplog.clear()
    given = autoscale.Autoscaler(_Producers(count=2, low=1, high=3), default_high=False)
    with caplog.at_level("INFO", logger="ferry.consumer"):
        given(100.0, 2)  # within the bound: nothing to say
        given(200.0, 4)
    said = [r.getMessage() for r in caplog.records if "at most" in r.getMessage()]
    assert len(said) == 1 and "at most 3 run here (local_producers_max)" in said[0], said
    assert given.producers.asked == [3]


# --- the options ------------------------------------------------------------------------------------------------
def test_the_bounds_default_to_one_and_the_usable_cpus_minus_one(monkeypatch):
    monkeypatch.setattr(autoscale, "usable_cpus", lambda: 8)
    assert count_bounds(LocalOptions(count="auto")) == (1, 7)
    assert count_bounds(LocalOptions(count="auto", min=2, max=3)) == (2, 3)
    assert count_bounds(LocalOptions(count=5)) == (5, 5)
    monkeypatch.setattr(autoscale, "usable_cpus", lambda: 1)
    assert count_bounds(LocalOptions(count="auto")) == (1, 1)  # at least one
    assert count_bounds(LocalOptions(count="auto", min=3)) == (3, 3)  # at least min
    monkeypatch.undo()
    assert autoscale.usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("kwargs, error, words", [
    ({"local_producers": "some"}, ConfigTypeError, ["local_producers", "'some'", '"auto"']),
    ({"local_producers": 2, "local_producers_max": 4}, ConfigError, ["max=", 'count="auto"', "count=2"]),
    ({"local_producers": "auto", "local_producers_min": 3, "local_producers_max": 2}, ConfigError,
     ["min=3", "max=2"]),
    ({"local_producers": "auto", "local_producers_max": 0}, ConfigError, ["local_producers_max", "0"]),
    ({"local_producers_max": 4}, ConfigError, ["local_producers_max", 'local_producers="auto"']),
    ({"local": LocalOptions(count="auto"), "local_producers_max": 4}, ConfigError, ["local_producers_max="]),
])
def test_bad_auto_options_are_refused_before_anything_starts(kwargs, error, words):
    with pytest.raises(error) as caught:
        RemoteLoader(dataset=PairDataset(8), batch_size=4, endpoint=None, **kwargs)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_auto_warns_of_excessive_producers_only_for_a_max_above_the_cpus():
    import warnings

    from ferry.consumer.options import warn_excessive_producers

    cpus = len(os.sched_getaffinity(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none expected: the default max is below the CPUs
        warn_excessive_producers(LocalOptions(count="auto"), stacklevel=1)
        warn_excessive_producers(LocalOptions(count="auto", max=cpus), stacklevel=1)
    with pytest.warns(UserWarning, match=rf"may start up to {cpus + 1} local producer.*local_producers_max"):
        warn_excessive_producers(LocalOptions(count="auto", max=cpus + 1), stacklevel=1)


def test_auto_is_one_option_given_either_way():
    assert LocalOptions(count="auto", max=4) == LocalOptions(count="auto", min=None, max=4)
    with pytest.raises(ConfigError, match=r"LocalOptions.min must be an int >= 1, got 0"):
        LocalOptions(count="auto", min=0)


# --- the mechanics, with real processes -------------------------------------------------------------------------
def _base_seed(generator_seed: int) -> int:
    generator = torch.Generator().manual_seed(generator_seed)
    # the first draw, as DataLoader's workers' base seed (tests/test_respawn.py)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.filterwarnings(SLEEPERS)
def test_scaling_keeps_the_epoch_exact_gives_fresh_seeds_and_never_replaces_a_producer_asked_to_stop(caplog):
    check = FullLeakCheck()
    with RemoteLoader(dataset=SeedDataset(length=240, delay=0.01), local_producers="auto", local_producers_max=3,
                      producer_threads=1, producer_slots=2, batch_size=4, max_attempts=1, timeout=30,
                      generator=torch.Generator().manual_seed(7)) as loader:
        (first,) = local_producer_pids(loader)
        assert loader.stats()["local_producers"] == 1
        rows, stopped, later = [], [], None
        for i, (index, seed, pid) in enumerate(loader):  # max_attempts=1: a task charged for a stop would poison
            rows += zip(index.tolist(), seed.tolist(), pid.tolist())
            if i == 5:
                scale_local_producers(loader, 3)
                wait_for(lambda: loader.stats()["producers"] == 3, 20, "three producers live")
                assert loader.stats()["local_producers"] == 3
            elif i == 25:  # each has tasks in flight (the loop is faster than they are), and the loop goes on
                stopped = local_producer_pids(loader)[1:]  # taking batches: each frees a credit, a TASK goes out
                scale_local_producers(loader, 1)
            elif i == 32:
                wait_for(lambda: local_producer_pids(loader) == [first], 10, "the set down to its first producer")
                wait_for(lambda: all(_gone(p) for p in stopped), 10, "the producers asked to stop to exit")
            elif i == 35:
                scale_local_producers(loader, 2)
                wait_for(lambda: len(local_producer_pids(loader)) == 2, 10, "a second producer")
                later = local_producer_pids(loader)[1]
                wait_for(lambda: loader.stats()["producers"] == 2, 20, "it joins")
        assert [r[0] for r in rows] == list(range(240)), "exactly once, in order"
        assert local_producer_pids(loader) == [first, later] and later not in stopped
        del index, seed, pid  # views of the slab
    seeds = {pid: seed for _, seed, pid in rows}
    base = _base_seed(7)
    # places 0, 1, 2 seeded base + place (of at most 3), then place 1 again: its next generation, a fresh seed
    assert [seeds[first], seeds[stopped[0]], seeds[stopped[1]]] == [(base + i) & MASK for i in range(3)]
    assert seeds[later] == (base + 1 + 1 * 3) & MASK, "the restarted place never served, or reused a seed"
    messages = [r.getMessage() for r in caplog.records]
    for pid in stopped:
        about = [m for m in messages if f"pid {pid}" in m]
        assert any("asked to stop" in m for m in about) and not any("respawn" in m or "died" in m for m in about), about
    check.assert_clean()


@pytest.mark.filterwarnings(SLEEPERS)
def test_producers_asked_to_stop_again_and_again_cost_no_attempt():
    """Three producers asked to stop at once, eight times over, while the loop takes batches (each frees a credit,
    and a TASK goes out at once): with ``max_attempts=1`` a task charged an attempt would poison its batch. One
    sent to a stopping producer whose socket had closed used to ("unreachable"), before its BYE was read."""
    with RemoteLoader(dataset=SeedDataset(length=800, delay=0.005), local_producers="auto", local_producers_max=4,
                      producer_threads=1, producer_slots=2, batch_size=4, max_attempts=1, timeout=30,
                      log_every=None) as loader:
        indices = []
        batches = iter(loader)
        for _ in range(8):
            scale_local_producers(loader, 4)
            try:
                wait_for(lambda: loader.stats()["producers"] == 4, 20, "four producers live")
            except AssertionError as exc:  # an intermittent failure seen twice in full runs: say what they were doing
                raise AssertionError(f"{exc}; stats {loader.stats()['per_producer']}\n"
                                     f"{describe_local_producers(loader)}") from None
            indices += next(batches)[0].tolist()
            scale_local_producers(loader, 1)
            for _ in range(6):
                indices += next(batches)[0].tolist()
            wait_for(lambda: len(local_producer_pids(loader)) == 1 and loader.stats()["producers"] == 1, 20,
                     "one producer left")
        indices += [i for index, _, _ in batches for i in index.tolist()]
        assert indices == list(range(800)), "exactly once, in order"
        assert loader.stats()["reissued"] > 0, "no producer was asked to stop holding a task"


# --- the measurement --------------------------------------------------------------------------------------------
STEP_FAST_S, STEP_SLOW_S = 0.04, 0.15
PERIOD = AUTOSCALE_PERIOD_S
SLOW_AFTER_S = 5 * PERIOD


@pytest.mark.filterwarnings(SLEEPERS)
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_from_one_producer_the_stall_falls_under_10_percent_within_three_control_periods(caplog):
    """One producer delivers about 10 batches/s (0.1 s a sample, batches of 4 on its 4 threads: the dataset's
    __getitem__ is thread-safe, and producer_threads says so; without it, one sample at a time). The step first
    takes 40 ms (the loop wants about 24 batches/s: 2.5 producers, so the gauge says 3, within max=4), and from
    25 s on 150 ms (about 6.5/s: one producer). Measured: the stall over the third control period (10-15 s after
    the first batch) is under 10 %; the set goes back to one producer once the loop slows, a minute or more after
    it last grew (a change against the last one's direction, so the direction changes at most once a minute),
    and the stall stays under 10 % with it; every batch of every epoch equals DataLoader's."""
    length, batch_size, seed = 1200, 4, 3
    references = [reference_batches(PairDataset(length, shape=(8,)), batch_size=batch_size, drop_last=False,
                                    world_size=1, rank=0, shuffle=True, seed=seed, epoch=e) for e in range(8)]
    timeline = []  # (seconds since the first batch, local producers, wait_s, active_s) after each batch
    began = began_wall = down_at = None
    with RemoteLoader(dataset=PairDataset(length, shape=(8,), delay=0.1), local_producers="auto",
                      local_producers_max=4, producer_threads=4, batch_size=batch_size, shuffle=True, seed=seed,
                      log_every=None, timeout=60) as loader:
        while down_at is None or timeline[-1][0] - down_at < 2 * PERIOD:
            epoch = loader.epoch
            assert epoch < len(references), f"ran out of reference epochs: {_changes(timeline)}"
            count = 0
            for seq, batch in enumerate(loader):
                assert_tree_equal(batch, references[epoch][seq], f"epoch {epoch} batch {seq}")
                count += 1
                now = time.monotonic()
                if began is None:
                    began, began_wall = now, time.time()
                stats, t = loader.stats(), now - began
                timeline.append((t, stats["local_producers"], stats["wait_s"], stats["active_s"]))
                if down_at is None and t >= SLOW_AFTER_S and stats["local_producers"] == 1:
                    down_at = t
                assert t < 150, f"no scale-down within 150 s: {_changes(timeline)}"
                if down_at is not None and t - down_at >= 2 * PERIOD:
                    break
                time.sleep(STEP_SLOW_S if t >= SLOW_AFTER_S else STEP_FAST_S)
            else:
                assert count == len(references[epoch]), f"epoch {epoch}: {count} batches"
    decisions = [(at - began_wall, before, after) for at, before, after in _decisions(caplog)]
    third = _stall(timeline, 2 * PERIOD, 3 * PERIOD)
    settled = _stall(timeline, down_at + 1.0, timeline[-1][0])
    last_up = max(at for at, before, after in decisions if after > before)
    periods = [f"{100 * _stall(timeline, k * PERIOD, (k + 1) * PERIOD):.1f}" for k in range(3)]
    print(f"\nauto: decisions {[(round(at, 1), b, a) for at, b, a in decisions]} (s after the first batch, from, "
          f"to); counts the loop saw {_changes(timeline)}; stall over the first three control periods {periods} %; "
          f"scale-down {decisions[-1][0] - last_up:.1f} s after the last scale-up; stall with one producer after it "
          f"{100 * settled:.1f} %")
    assert third < 0.10, f"stall {100 * third:.1f} % over {2 * PERIOD:g}-{3 * PERIOD:g} s: {decisions}"
    assert decisions[0][0] < 2 * PERIOD and decisions[0][2] > 1, f"the first scale-up came late: {decisions}"
    assert max(n for _, n, _, _ in timeline) <= 4 and decisions[-1][2] == 1, decisions
    for (at, b0, a0), (next_at, b1, a1) in zip(decisions, decisions[1:]):
        assert next_at - at >= PERIOD - 0.5, f"two changes within a control period: {decisions}"
        if (a0 > b0) != (a1 > b1):
            assert next_at - at >= 60.0, f"the direction changed {next_at - at:.1f} s after a change: {decisions}"
    assert settled < 0.10, f"stall {100 * settled:.1f} % with one producer after the loop slowed"


def _stall(timeline: list[tuple[float, int, float, float]], start: float, end: float) -> float:
    """The loop's stall fraction between two of its times: waited over iterated."""
    inside = [row for row in timeline if start <= row[0] <= end]
    assert len(inside) >= 2, f"no batches between {start:g} and {end:g} s"
    (_, _, wait0, active0), (_, _, wait1, active1) = inside[0], inside[-1]
    return (wait1 - wait0) / (active1 - active0)


def _changes(timeline: list[tuple[float, int, float, float]]) -> list[tuple[float, int]]:
    """(time, count) at each change of the count the loop saw."""
    if not timeline:
        return []
    out = [(round(timeline[0][0], 1), timeline[0][1])]
    for t, n, _, _ in timeline[1:]:
        if n != out[-1][1]:
            out.append((round(t, 1), n))
    return out


def _decisions(caplog: pytest.LogCaptureFixture) -> list[tuple[float, int, int]]:
    """(wall time, from, to) of each autoscaler decision, as it logged them."""
    found = []
    for record in caplog.records:
        match = re.match(r"ferry: local producers (\d+) -> (\d+)", record.getMessage())
        if match:
            found.append((record.created, int(match[1]), int(match[2])))
    return found
