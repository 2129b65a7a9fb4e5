"""spawn and forkserver work with a dataset class defined in the training script (``__main__``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset

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


class _HoldsAFile(PairDataset):
    """Opens its file in __init__, as a DataLoader-era dataset may: fine under fork, not picklable."""

    def __init__(self) -> None:
        super().__init__(length=8)
        self.handle = open(__file__, "rb")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_what_cannot_be_pickled_for_a_spawned_producer_is_a_config_error_naming_the_option(method):
    """Under spawn and forkserver the dataset and the hooks are pickled: a lambda or an open file is named, with
    the fix, when the loader is built (the bare PicklingError named neither the option nor what to do)."""
    from ferry import ConfigError

    with pytest.raises(ConfigError, match=r"^collate_fn=<function .*lambda.* cannot be sent to a "
                                          rf"{method} producer.*mp_context=\"fork\""):
        RemoteLoader(dataset=PairDataset(length=8), batch_size=2, local_producers=1, mp_context=method,
                     collate_fn=lambda batch: batch)
    dataset = _HoldsAFile()
    try:
        with pytest.raises(ConfigError, match=r"^dataset=<.*_HoldsAFile.*cannot pickle '_io.BufferedReader'.*"
                                              r"open files and connections in __getitem__"):
            RemoteLoader(dataset=dataset, batch_size=2, local_producers=1, mp_context=method)
    finally:
        dataset.handle.close()
