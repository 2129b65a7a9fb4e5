"""Local producers respawn (issue 18, part 7): one that dies is replaced, with back-off and a bound on restarts
a minute, its exit cause logged, so a SIGKILL or a sample that crashes its loader does not cost throughput for
the rest of the run. Exactly once and order hold through the replacement; the poison-task limit still ends a
batch that kills every producer it touches. Real processes; the budget's arithmetic as a unit."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from ferry import PoisonTaskError, ProducerDiedError, RemoteLoader
from ferry.consumer.local import producers as local_producers
from ferry.consumer.local.respawn import Replacements, RespawnBudget

from tests.lifecycle_datasets import SeedDataset, SegfaultAt

from .helpers import FullLeakCheck, local_producer_pids, wait_for

MASK = (1 << 63) - 1


def _base_seed(generator_seed: int) -> int:
    generator = torch.Generator().manual_seed(generator_seed)
    # the first draw, as DataLoader's workers' base seed (it is the loader's seed too)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _live(loader) -> set[int]:
    return {int(name.rsplit(":", 1)[1]) for name in loader.stats()["per_producer"]}


def test_a_sigkilled_producer_is_replaced_and_the_epoch_stays_exactly_once_and_in_order(caplog):
    check = FullLeakCheck()
    with RemoteLoader(dataset=SeedDataset(length=96, delay=0.01), local_producers=2, producer_threads=1,
                      producer_slots=2, batch_size=4, timeout=30,
                      generator=torch.Generator().manual_seed(5)) as loader:
        first = local_producer_pids(loader)
        rows = []
        for i, (index, seed, pid) in enumerate(loader):
            rows += zip(index.tolist(), seed.tolist(), pid.tolist())
            if i == 3:
                os.kill(first[0], signal.SIGKILL)
                wait_for(lambda: local_producer_pids(loader)[0] != first[0], 10, "a replacement process")
                replacement = local_producer_pids(loader)[0]
                wait_for(lambda: _live(loader) == {replacement, first[1]}, 20, "the replacement to join")
        assert [r[0] for r in rows] == list(range(96)), "exactly once, in order"
        assert local_producer_pids(loader) == [replacement, first[1]]
        del index, seed, pid  # views of the slab
    seeds = {pid: seed for _, seed, pid in rows}
    base = _base_seed(5)
    assert seeds[first[1]] == (base + 1) & MASK
    # a replacement is seeded from (base seed, producer id) and its generation: no stream is ever repeated
    assert seeds[replacement] == (base + 0 + 2) & MASK, "the replacement never served, or has a reused seed"
    deaths = [r.getMessage() for r in caplog.records if f"pid {first[0]}" in r.getMessage()]
    assert any("killed by SIGKILL" in m and "respawn" in m for m in deaths), deaths
    check.assert_clean()


def test_a_sample_that_segfaults_its_loader_is_poisoned_and_the_producers_come_back():
    with RemoteLoader(dataset=SegfaultAt(length=40, crash=(9,)), local_producers=2, producer_threads=1,
                      producer_slots=1, batch_size=4, max_attempts=2, timeout=30) as loader:
        labels, poisoned = [], []
        it = iter(loader)
        for _ in range(20):  # bounded: 10 batches and one error
            try:
                _, y = next(it)
            except StopIteration:
                break
            except PoisonTaskError as exc:
                poisoned.append(exc)
                continue
            labels += y.tolist()
        assert [e.seq for e in poisoned] == [2]
        assert labels == [i for i in range(40) if not 8 <= i < 12]
        assert all("SIGSEGV" in cause for _, cause in poisoned[0].attempts), poisoned[0].attempts
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "both producers back")


@pytest.mark.parametrize("kind", ["spec", "object", "spawn"])
def test_the_last_producer_sigkilled_is_respawned_and_the_run_goes_on(kind, caplog):
    dataset = "synthetic" if kind == "spec" else SeedDataset(length=400, delay=0.005)
    args = {"length": 400, "shape": [2], "delay": 0.005} if kind == "spec" else None
    with RemoteLoader(dataset=dataset, dataset_args=args, local_producers=1, batch_size=4, timeout=30,
                      mp_context="spawn" if kind == "spawn" else None) as loader:
        it = iter(loader)
        next(it)
        victim = local_producer_pids(loader)[0]
        os.kill(victim, signal.SIGKILL)
        for _ in range(99):  # the whole epoch: nothing raises, the replacement serves the rest
            next(it)
        with pytest.raises(StopIteration):
            next(it)
        assert local_producer_pids(loader)[0] != victim
    assert any(f"pid {victim}" in r.getMessage() and "respawn" in r.getMessage() for r in caplog.records)


def test_a_producer_that_keeps_dying_is_respawned_within_the_bound_then_the_loader_gives_up(monkeypatch, caplog):
    monkeypatch.setattr(local_producers, "RESPAWNS_PER_WINDOW", 2)
    with RemoteLoader(dataset=SegfaultAt(length=40, crash=range(40)), local_producers=1, producer_threads=1,
                      batch_size=4, max_attempts=50, timeout=30) as loader:
        with pytest.raises(ProducerDiedError) as caught:
            next(iter(loader))
    text = str(caught.value)
    assert "killed by SIGSEGV" in text and "respawned 2 times" in text, text
    assert any(r.levelno == logging.ERROR and "not respawned" in r.getMessage() for r in caplog.records)


# --- the budget, as a unit ------------------------------------------------------------------------------------
def test_the_budget_backs_off_per_producer_and_bounds_restarts_in_a_window():
    budget = RespawnBudget(limit=3, window=60.0, first_delay=0.1, max_delay=0.3)
    assert budget.next_delay(0, now=0.0) == 0.1
    assert budget.next_delay(0, now=1.0) == 0.2  # doubles for the same producer
    assert budget.next_delay(1, now=1.5) == 0.1  # another producer starts afresh
    assert budget.next_delay(0, now=2.0) == 0.3  # capped
    assert budget.next_delay(0, now=3.0) is None  # a 4th restart within 60 s: over the bound
    assert budget.restarts(0, now=3.0) == 3
    assert budget.next_delay(0, now=61.5) == 0.2  # two have left the window: one restart in it, backing off
    assert budget.next_delay(0, now=200.0) == 0.1  # a quiet minute: starts afresh


def test_only_a_producer_that_died_mid_run_without_being_asked_to_is_replaced():
    plans = Replacements(RespawnBudget(limit=1, window=60.0, first_delay=0.1, max_delay=1.0))
    kill, term = -signal.SIGKILL, -signal.SIGTERM
    assert "no producer has served yet" in plans.plan(0, kill, served=False, now=0.0)[0]
    assert "asked to stop" in plans.plan(0, 0, served=True, now=0.0)[0]
    assert "asked to stop" in plans.plan(0, term, served=True, now=0.0)[0]
    # an orderly stop is news, not an alarm (Ctrl-C in a terminal reaches every producer), and it is what it is
    # as the loader shuts down too, when no producer counts as having served any more
    assert plans.plan(0, -signal.SIGINT, served=False, now=0.0) == ("it was asked to stop, so it is not respawned",
                                                                    logging.INFO)
    assert not plans.pending
    text, level = plans.plan(0, kill, served=True, now=0.0)
    assert text == "respawning it in 0.10 s" and level == logging.WARNING and plans.pending
    assert plans.take_ready(now=0.05) == [] and plans.take_ready(now=0.1) == [0]
    assert plans.pending, "a replacement being started is still pending"
    plans.done(0)
    assert not plans.pending
    text, level = plans.plan(0, -signal.SIGSEGV, served=True, now=1.0)
    assert "not respawned: it was restarted 1 times in the last 60 s" in text and level == logging.ERROR
    assert plans.bound_note() == "; producer 0 was respawned 1 times in the last 60 s, the bound"
