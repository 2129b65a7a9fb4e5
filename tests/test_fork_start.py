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
