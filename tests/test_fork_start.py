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
        assert "ferry.producer.service" not in sys.modules  # importing the package stays light
        ferry.producer.preload()
        assert "ferry.producer.service" in sys.modules and "ferry.producer.batcher" in sys.modules
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-2000:]


def test_auto_compression_on_a_local_link_loads_no_codec_library_but_a_remote_link_does():
    code = textwrap.dedent("""
        import sys
        from ferry.producer.compressing import FrameCompressor, LinkCompression
        pool = FrameCompressor(workers=1)
        welcome = {"compression": "auto", "codecs": ["lz4", "zstd"]}
        for endpoint in ("ipc:///tmp/ferry-none.sock", "tcp://trainer.invalid:5555"):  # objects only: nothing connects
            link = LinkCompression(endpoint, None, pool)
            link.welcome(welcome)
            loaded = sorted(m for m in ("lz4", "zstandard") if m in sys.modules)
            print(endpoint, link.codec, link.meter is not None, loaded)
            if link.meter is not None:
                link.meter.close()
        pool.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]
    local, remote = out.stdout.splitlines()
    assert local == "ipc:///tmp/ferry-none.sock None False []", local
    assert remote == "tcp://trainer.invalid:5555 None True ['lz4', 'zstandard']", remote
