"""spawn and forkserver work with a dataset class defined in the training script (``__main__``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import sys

    import numpy as np
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from ferry import RemoteLoader


    class Tiles:  # defined in __main__, as in most training scripts
        def __len__(self):
            return 26

        def __getitem__(self, i):
            return np.full((2, 3), i, dtype=np.float32), i


    if __name__ == "__main__":
        method = sys.argv[1]
        sampler = DistributedSampler(Tiles(), num_replicas=1, rank=0, shuffle=True, seed=4)
        expected = list(DataLoader(Tiles(), batch_size=4, sampler=sampler))
        with RemoteLoader(dataset=Tiles(), local_producers=2, batch_size=4, shuffle=True, seed=4,
                          mp_context=method, timeout=60) as loader:
            got = list(loader)
        assert len(got) == len(expected) == 7, (len(got), len(expected))
        for (gx, gy), (ex, ey) in zip(got, expected):
            assert torch.equal(gx, ex) and torch.equal(gy, ey)
        print("OK", method)
''')


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_main_module_dataset_class_under(method, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(script), method], cwd=str(tmp_path), env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0 and f"OK {method}" in out.stdout, out.stdout + out.stderr[-3000:]
