"""``--collate-arg`` and ``--transform-arg`` (issue 18): a hook's settings (mixup's alpha) for hand-started
producers, their ``FERRY_*`` variables, and the loader's local mode (``collate_args=``,
``producer_transform_args=``). A function gets them as keywords; a class is built with them. Real producers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ferry import RemoteLoader
from ferry.producer.cli import command_line, command_line_values
from ferry.producer.config import ProducerConfig, read_env
from tests.datasets import PairDataset

from .helpers import REPO, producer_env, wait_for

HOOKS = ["--collate", "tests.transforms:scaled_collate", "--collate-arg", "alpha=0.25",
         "--transform", "tests.transforms:Shift", "--transform-arg", "amount=3"]


def expected(indices) -> np.ndarray:
    return np.stack([(PairDataset(6)[i][0] + 3) * 0.25 for i in indices])


def test_hand_started_producer_passes_the_arguments_to_its_hooks(endpoint, spawn):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 6}, threads=1, slots=2, extra=HOOKS)
    with RemoteLoader(endpoint=endpoint, batch_size=3, heartbeat=0.2, timeout=30, log_every=None) as loader:
        wait_for(lambda: loader.stats()["producers"] == 1, 20, "the producer")
        batches = [(x.numpy(), y.tolist()) for x, y in loader]
    assert [y for _, y in batches] == [[0, 1, 2], [3, 4, 5]]
    for x, y in batches:
        assert np.array_equal(x, expected(y))


def test_local_mode_takes_the_arguments_as_keywords():
    with RemoteLoader(dataset="tests.datasets:PairDataset", dataset_args={"length": 6}, local_producers=1,
                      batch_size=3, collate_fn="tests.transforms:scaled_collate", collate_args={"alpha": 0.25},
                      producer_transform="tests.transforms:Shift", producer_transform_args={"amount": 3},
                      log_every=None) as loader:
        batches = [(x.numpy(), y.tolist()) for x, y in loader]
    assert [y for _, y in batches] == [[0, 1, 2], [3, 4, 5]]
    for x, y in batches:
        assert np.array_equal(x, expected(y))


def test_variables_and_the_command_line_a_local_producer_gets():
    from ferry.producer.cli import build_parser

    env = read_env({"FERRY_COLLATE_ARGS": '{"alpha": 0.5}', "FERRY_TRANSFORM_ARGS": '{"amount": 1}'})
    flags = build_parser(env=env).parse_args(["--connect", "tcp://127.0.0.1:5", "--collate-arg", "beta=2"])
    values = command_line_values(vars(flags), env)
    assert values["collate_args"] == {"alpha": 0.5, "beta": 2} and values["transform_args"] == {"amount": 1}
    config = ProducerConfig(endpoints=("tcp://127.0.0.1:5",), dataset="synthetic", collate="m:f",
                            collate_args={"alpha": 0.2}, transform="m:g", transform_args={"size": [3, 4]})
    argv, _ = command_line(config)
    assert argv[argv.index("--collate-arg") + 1] == "alpha=0.2"
    assert argv[argv.index("--transform-arg") + 1] == "size=[3, 4]"


@pytest.mark.parametrize("flags, cause", [
    (["--collate-arg", "alpha=0.25"], "collate_args without a collate"),
    (["--collate", "tests.transforms:scaled_collate", "--collate-arg", "beta=1"], "unexpected keyword argument 'beta'"),
    (["--transform", "tests.transforms:Shift", "--transform-arg", "size=1"], "unexpected keyword argument 'size'"),
    (["--collate", "tests.transforms:scaled_collate", "--collate-arg", "alpha"], "must look like key=value"),
])
def test_bad_arguments_are_one_clear_line(flags, cause):
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", "tcp://127.0.0.1:5", "--dataset",
                          "tests.datasets:PairDataset", *flags], capture_output=True, text=True, env=producer_env(),
                         cwd=REPO, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ferry producer: error:") and cause in lines[0], out.stderr


def test_the_transform_arguments_are_part_of_the_fingerprint():
    from ferry.common.datasets import Transformed

    one = Transformed(PairDataset(6), "tests.transforms:Shift", {"amount": 1}).fingerprint
    two = Transformed(PairDataset(6), "tests.transforms:Shift", {"amount": 2}).fingerprint
    assert one != two and "amount" in one
