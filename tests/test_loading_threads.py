"""A dataset class of the user's own is called one sample at a time in each producer, as a DataLoader worker calls
it, unless ``--threads`` (``producer_threads=``) says it may be called from several threads at once. A dataset
written for DataLoader need not be thread-safe: one file handle it seeks in, shared by two loading threads, loads
the wrong bytes without an error. Ferry's built-in datasets are thread-safe and load with DEFAULT_THREADS.

OverlapProbe (tests/datasets.py) makes overlap certain where it is allowed: its sample 1 waits for another load to
start while it runs. Each sample reports the most loads its process has seen at once."""

from __future__ import annotations

from ferry import RemoteLoader
from ferry.common.constants import DEFAULT_THREADS
from ferry.common.datasets import Transformed, resolve_dataset
from ferry.producer.loading.samples import loads_concurrently
from tests.datasets import OverlapProbe, PairDataset, ThreadBound
from tests.transforms import negate_and_tag

from .helpers import wait_for

QUIET = {"log_every": None, "timeout": 60}


def rows(loader) -> dict[int, int]:
    """One epoch: sample index -> the most loads at once its producer had seen when it loaded."""
    return {int(i): int(peak) for batch in loader for i, peak in batch.tolist()}


def test_only_the_built_ins_load_concurrently_unless_threads_are_given():
    synthetic = resolve_dataset("synthetic", {"length": 4, "shape": [2]})
    assert loads_concurrently(synthetic, None)
    assert loads_concurrently(Transformed(synthetic, negate_and_tag), None)  # the transform: documented as thread-safe
    assert not loads_concurrently(PairDataset(4), None)
    assert not loads_concurrently(Transformed(PairDataset(4), negate_and_tag), None)  # a user's class inside the wrapper
    assert loads_concurrently(PairDataset(4), 4) and loads_concurrently(PairDataset(4), 1)  # --threads: as given


def test_a_users_dataset_loads_one_sample_at_a_time_in_a_local_producer():
    with RemoteLoader(dataset=OverlapProbe(length=16, wait=0.3), local_producers=1, batch_size=8, **QUIET) as loader:
        got = rows(loader)
        stats = loader.stats()
    assert sorted(got) == list(range(16))
    assert max(got.values()) == 1, got  # sample 1 waited out its 0.3 s: nothing else loaded meanwhile
    assert [p["serial"] for p in stats["per_producer"].values()] == [True]  # its HELLO said so, for the diagnosis


def test_producer_threads_lets_a_thread_safe_dataset_load_concurrently():
    with RemoteLoader(dataset=OverlapProbe(length=16, wait=30), local_producers=1, producer_threads=4, batch_size=8,
                      **QUIET) as loader:
        got = rows(loader)
        stats = loader.stats()
    assert sorted(got) == list(range(16))
    assert [p["serial"] for p in stats["per_producer"].values()] == [False]
    assert got[1] >= 2, got  # another load started while sample 1 ran (it waited at most 30 s for one)


def test_a_producer_started_by_hand_loads_a_users_dataset_one_sample_at_a_time_and_says_why(endpoint, spawn):
    producer = spawn(endpoint, "tests.datasets:OverlapProbe", {"length": 16, "wait": 0.3}, threads=None)
    with RemoteLoader(endpoint=endpoint, batch_size=8, heartbeat=0.2, **QUIET) as loader:
        got = rows(loader)
    assert sorted(got) == list(range(16))
    assert max(got.values()) == 1, got
    wait_for(lambda: "loading threads 1 (a dataset class of your own" in producer.output(), 10, "the start line")
    assert "--threads N if it is thread-safe" in producer.output()


def test_a_producer_of_a_built_in_dataset_starts_its_default_threads(endpoint, spawn):
    producer = spawn(endpoint, "synthetic", {"length": 16, "shape": [2]}, threads=None)
    wait_for(lambda: f"loading threads {DEFAULT_THREADS}," in producer.output(), 30, "the start line")


def test_a_dataset_a_consumer_names_from_a_pool_loads_one_sample_at_a_time(endpoint, spawn):
    """A pool producer (no dataset of its own) opens a user's spec a consumer names: the same rule as for its own."""
    spawn(endpoint, "", threads=None, extra=["--allow-dataset", "tests.datasets:OverlapProbe"])
    with RemoteLoader(endpoint=endpoint, dataset="tests.datasets:OverlapProbe", dataset_args={"length": 16, "wait": 0.3},
                      batch_size=8, heartbeat=0.2, **QUIET) as loader:
        got = rows(loader)
    assert sorted(got) == list(range(16))
    assert max(got.values()) == 1, got


def test_a_users_dataset_always_loads_on_the_same_thread_even_one_sample_batches():
    """Batches of one sample, and an unbatched loader's samples, are not loaded on the batch workers: a dataset
    whose connection only works on the thread that opened it sees one thread, as in a DataLoader worker."""
    for options in ({"batch_size": 1}, {"batch_size": None}, {"batch_size": 3}):  # 16 = 5 x 3 + a batch of 1
        with RemoteLoader(dataset=ThreadBound(16), local_producers=1, producer_slots=4, **options, **QUIET) as loader:
            got = [row.tolist() if hasattr(row, "tolist") else row for batch in loader
                   for row in (batch if batch.ndim == 2 else [batch])]
        assert sorted(i for i, _ in got) == list(range(16)), options
        assert {n for _, n in got} == {1}, (options, got)


def test_the_diagnosis_of_a_run_bound_by_such_producers_names_producer_threads():
    with RemoteLoader(dataset=PairDataset(24, delay=0.02), local_producers=1, batch_size=4, **QUIET) as loader:
        assert sum(1 for _ in loader) == 6
        text = loader.diagnosis()
    assert "bound by the producers" in text and "it loads your dataset class one sample at a time" in text, text
    assert "producer_threads=4" in text, text
