"""``python -m ferry.producer --help`` lists every built-in dataset with its keyword arguments (issue 18), from
the built-ins themselves: a new one, or a new argument, shows up without editing the help."""

from __future__ import annotations

import inspect
import subprocess
import sys

from ferry.common.datasets import BUILTINS

from .helpers import REPO, producer_env


def test_help_lists_every_built_in_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--help"], capture_output=True, text=True,
                         env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    section = text[text.index("Built-in datasets"):]
    lines = section.splitlines()
    for name, factory in BUILTINS.items():
        entry = [i for i, line in enumerate(lines) if line.strip().startswith(name + " ")]
        assert entry, f"{name} is not listed:\n{section}"
        block = " ".join(lines[entry[0]:entry[0] + 4])
        for parameter in inspect.signature(factory).parameters:
            assert parameter in block, f"{name}'s argument {parameter} is not listed: {block}"
    assert "shuffle_buffer" in section and "resize" in section and "--collate-arg" in text
