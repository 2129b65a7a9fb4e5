"""Say what producers must serve (issue 11, item 4): with ``dataset=`` (an object or a spec) and no local
producers, a producer serving another dataset is refused for good, with the reason on both sides; without
it, the log names the producer that set the dataset. Real producer processes; every wait bounded."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from ferry import RemoteLoader
from ferry.consumer.core.admission import _module_hint
from tests.datasets import PairDataset

from .helpers import producer_env, wait_for


def test_a_producer_serving_another_dataset_is_refused_when_the_loader_was_given_the_object(endpoint, spawn,
                                                                                            caplog):
    with RemoteLoader(endpoint=endpoint, dataset=PairDataset(20), batch_size=4, heartbeat=0.2, timeout=30) as loader:
        stranger = spawn(endpoint, "tests.datasets:DictDataset", {"length": 20}, threads=1, slots=1)
        longer = spawn(endpoint, "tests.datasets:PairDataset", {"length": 30}, threads=1, slots=1)
        assert stranger.proc.wait(30) == 3 and longer.proc.wait(30) == 3  # rejected by every consumer: exit 3
        assert "rejected this producer" in stranger.output() and "fingerprint" in stranger.output()
        assert "rejected this producer" in longer.output() and "length 30" in longer.output()
        assert loader.stats()["producers_seen"] == 0
        spawn(endpoint, "tests.datasets:PairDataset", {"length": 20}, threads=1, slots=2)
        labels = [y.tolist() for _, y in loader]
    assert sum(labels, []) == list(range(20))
    refusals = [r.getMessage() for r in caplog.records if "rejected producer" in r.getMessage()]
    assert len(refusals) >= 2 and all(r.levelno == logging.WARNING for r in caplog.records
                                      if "rejected producer" in r.getMessage())


def test_a_producer_serving_another_spec_is_refused_when_the_loader_was_given_a_spec(endpoint, spawn, caplog):
    with RemoteLoader(endpoint=endpoint, dataset="tests.datasets:PairDataset", batch_size=4, heartbeat=0.2,
                      timeout=30) as loader:
        stranger = spawn(endpoint, "tests.datasets:DictDataset", {"length": 20}, threads=1, slots=1)
        assert stranger.proc.wait(30) == 3
        assert "dataset='tests.datasets:PairDataset'" in stranger.output()
        assert loader.stats()["producers_seen"] == 0
        right = spawn(endpoint, "tests.datasets:PairDataset", {"length": 12}, threads=1, slots=2)
        labels = [y.tolist() for _, y in loader]
    assert sum(labels, []) == list(range(12))
    set_by = [r.getMessage() for r in caplog.records if "set the dataset" in r.getMessage()]
    assert len(set_by) == 1 and f":{right.pid} set the dataset: 12 samples" in set_by[0]


def test_without_a_dataset_the_log_says_which_producer_set_its_length_and_fingerprint(endpoint, spawn, caplog):
    with RemoteLoader(endpoint=endpoint, batch_size=5, heartbeat=0.2, timeout=30) as loader:
        first = spawn(endpoint, "tests.datasets:PairDataset", {"length": 10}, threads=1, slots=2)
        wait_for(lambda: loader.stats()["producers"] == 1, 20, "the producer")
        assert len(loader) == 2
    records = [r for r in caplog.records if "set the dataset" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    message = records[0].getMessage()
    assert f":{first.pid} set the dataset: 10 samples" in message and "tests.datasets.PairDataset:10" in message


SCRIPT = textwrap.dedent("""
    import sys

    import torch

    from ferry import RemoteLoader


    class ScriptDS(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            return torch.full((2,), float(index)), index


    if __name__ == "__main__":
        with RemoteLoader(endpoint=sys.argv[1], dataset=ScriptDS(), batch_size=4, heartbeat=0.2, timeout=30,
                          no_producer_timeout=30) as loader:
            print("labels", sorted(i for _, y in loader for i in y.tolist()), flush=True)
""")


def test_a_class_of_the_training_script_is_served_by_a_producer_started_with_the_script_name(tmp_path, endpoint,
                                                                                           spawn):
    """A trial user's DDP script defined its Dataset class in the script and passed the object to the loader; a
    producer started by hand with ``--dataset train:ScriptDS`` was refused (fingerprint 'train.ScriptDS:12'
    against '__main__.ScriptDS:12'), and the error advised the command already run. The fingerprint now names
    a class of the script by the script's module, as the producer imports it."""
    (tmp_path / "train.py").write_text(SCRIPT)
    env = producer_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    trainer = subprocess.Popen([sys.executable, "train.py", endpoint], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        producer = spawn(endpoint, "train:ScriptDS", threads=1, slots=2, env={"PYTHONPATH": env["PYTHONPATH"]})
        out, _ = trainer.communicate(timeout=90)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
    assert trainer.returncode == 0 and f"labels {list(range(12))}" in out, out[-3000:] + producer.output()[-2000:]


def test_the_same_class_under_two_module_names_is_refused_with_what_to_do():
    hint = _module_hint("train.ScriptDS:12", "pkg.train.ScriptDS:12")
    assert "the same class under two module names" in hint and "'pkg.train'" in hint and "fingerprint" in hint
    assert _module_hint("train.ScriptDS:12", "train.ScriptDS:13") == ""  # another length: nothing to add
    assert _module_hint("a.One:12", "a.Two:12") == ""
    assert "move it into a module" in _module_hint("train.ScriptDS:12", "__main__.ScriptDS:12")
