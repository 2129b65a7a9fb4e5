"""What a test needs from the machine it runs on, and what happens where that is missing.

Off CI a test whose need is missing is skipped, saying why. Under ``CI=true`` it fails instead: CI runs as root
on a machine that has all of it (.ci/run installs the tools and extras), so a skip there would hide a test that
never ran.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

# decided here, not by ferry.common.shm.available(): a bug there must fail the tests, not skip them
HAS_SHARED_MEMORY = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def cannot_run(reason: str) -> None:
    """Skip the calling test (or, called at import, its module) because ``reason``; under ``CI=true`` fail it
    instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def shared_memory() -> None:
    """The shared-memory slab needs memfd_create and /proc."""
    if not HAS_SHARED_MEMORY:
        cannot_run("shared memory needs memfd_create and /proc")


def module(name: str, extra: str) -> Any:
    """The Python module ``name``, which the extra ``extra`` of ferry installs, imported and returned."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        cannot_run(f"{name} is not installed (pip install 'ferry[{extra}]')")


def tool(name: str, package: str) -> None:
    """The command ``name`` on PATH, which Debian's ``package`` installs."""
    if shutil.which(name) is None:
        cannot_run(f"{name} is not installed (apt-get install {package})")
