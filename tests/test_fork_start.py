"""What a local producer forked from the trainer pays before its first batch: no imports of the producer's
modules, no garbage-collector pass over the trainer's objects (the producer freezes what it inherited, and
the trainer's collector is left exactly as it was), no codec library on a local link."""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ferry import RemoteLoader


class FreezeCountDataset:
    """Labels each sample with the number of objects frozen out of the producer process's collector."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return np.full(2, index, dtype=np.float32), gc.get_freeze_count()


class CollectionFaults:
    """Labels each sample with the minor page faults its producer thread took for one full collection."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        gc.collect()
        return np.zeros(2, dtype=np.float32), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_forked_producers_freeze_the_objects_they_inherited():
    assert gc.get_freeze_count() == 0
    with RemoteLoader(dataset=FreezeCountDataset(), local_producers=2, batch_size=4, mp_context="fork",
                      timeout=60) as loader:
        labels = torch.cat([y for _, y in loader])
    assert len(labels) == 12
    assert bool((labels > 1000).all()), labels  # every producer froze what it inherited from the trainer
    assert gc.get_freeze_count() == 0  # and the trainer froze nothing


def test_a_forked_producers_collection_does_not_write_into_the_trainers_objects():
    # about 160k pages' worth of small tracked objects, inherited by the producer: a collection that walked
    # them would write into each of their GC headers, and so copy each of their pages (a fault per page)
    inherited = [[i] for i in range(400_000)]
    with RemoteLoader(dataset=CollectionFaults(), local_producers=1, batch_size=4, mp_context="fork",
                      producer_threads=1, timeout=60) as loader:
        faults = torch.cat([y for _, y in loader])
    assert len(faults) == 8 and len(inherited) == 400_000
    # measured: 20-24 faults for the first collection, 0-1 for later ones; 16.5k for the first without the freeze
    assert int(faults.max()) < 1000, faults


@pytest.mark.parametrize("frozen_by_trainer", [False, True], ids=["unfrozen", "frozen-by-trainer"])
@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_the_trainers_collector_is_left_exactly_as_it_was(frozen_by_trainer, enabled):
    gc.collect()  # nothing frozen dies during the test: the count below changes only if someone freezes
    if frozen_by_trainer:
        gc.freeze()
    if not enabled:
        gc.disable()
    frozen = gc.get_freeze_count()
    try:
        with RemoteLoader(dataset=FreezeCountDataset(), local_producers=2, batch_size=4, mp_context="fork",
                          timeout=60) as loader:
            assert (gc.get_freeze_count(), gc.isenabled()) == (frozen, enabled)
            labels = torch.cat([y for _, y in loader])
        assert (gc.get_freeze_count(), gc.isenabled()) == (frozen, enabled)
    finally:
        gc.unfreeze()
        gc.enable()
    assert (frozen > 1000) is frozen_by_trainer
    # the producers still froze what they inherited (not "at least the trainer's count": forked from the watch
    # thread, a child frees the other threads' states at the fork, a few dozen frozen objects among them)
    assert bool((labels > 1000).all()), labels


def test_preload_loads_what_serve_needs():
    code = textwrap.dedent("""
        import sys
        import ferry.producer
        assert "ferry.producer.io.service" not in sys.modules  # importing the package stays light
        ferry.producer.preload()
        assert "ferry.producer.io.service" in sys.modules and "ferry.producer.loading.batcher" in sys.modules
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_producer_loads_a_codec_library_only_when_a_task_names_its_codec():
    """Local links never compress (the consumer never names a codec for them), so a producer forked from the
    trainer never pays for loading lz4 or zstandard: about 100 ms in a process that has torch loaded."""
    code = textwrap.dedent("""
        import sys
        from ferry.producer.loading.compressing import LinkCodec
        link = LinkCodec("ipc:///tmp/ferry-none.sock", None)  # an object only: nothing connects
        link.welcome({"codecs": ["lz4", "zstd"]})
        task = {"session": 1, "task": 1, "epoch": 0, "seq": 0, "indices": [0], "on_error": "raise"}
        print(link.task(task), sorted(m for m in ("lz4", "zstandard") if m in sys.modules))
        print(link.task({**task, "compression": "zstd"}), sorted(m for m in ("lz4", "zstandard") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]
    untouched, asked = out.stdout.splitlines()
    assert untouched == "None []", untouched
    assert asked == "zstd ['zstandard']", asked
