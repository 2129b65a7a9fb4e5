"""What a local producer forked from the trainer pays before its first batch: no imports of the producer's
modules, no garbage-collector pass over the trainer's objects, no codec library on a local link."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch

from ferry import RemoteLoader


class FreezeCountDataset:
    """Labels each sample with the number of objects frozen out of the producer process's collector."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return np.full(2, index, dtype=np.float32), gc.get_freeze_count()


def test_forked_producers_leave_the_trainers_objects_to_their_collector_and_the_trainer_unfrozen():
    assert gc.get_freeze_count() == 0
    with RemoteLoader(dataset=FreezeCountDataset(), local_producers=2, batch_size=4, mp_context="fork",
                      timeout=60) as loader:
        assert gc.get_freeze_count() == 0  # the trainer's own collector sees its objects again at once
        labels = torch.cat([y for _, y in loader])
    assert len(labels) == 12
    assert bool((labels > 1000).all()), labels  # every producer inherited the trainer's objects frozen


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


def test_a_producer_loads_a_codec_library_only_when_a_task_names_its_codec():
    """Local links never compress (the consumer never names a codec for them), so a producer forked from the
    trainer never pays for loading lz4 or zstandard: about 100 ms in a process that has torch loaded."""
    code = textwrap.dedent("""
        import sys
        from ferry.producer.compressing import LinkCodec
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


def test_a_trainer_that_froze_its_objects_itself_keeps_them_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with RemoteLoader(dataset=FreezeCountDataset(), local_producers=1, batch_size=4, mp_context="fork",
                          timeout=60) as loader:
            assert gc.get_freeze_count() >= frozen  # not undone behind the user's back
            assert len(list(loader)) == 3
    finally:
        gc.unfreeze()
