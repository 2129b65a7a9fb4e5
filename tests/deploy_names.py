"""The names that deployment files (deploy/kubernetes/, deploy/swarm/) may use, taken from Ferry itself so that the
files cannot drift from it: the producer's FERRY_* variables, the variables a trainer container reads (RemoteLoader's
and the demo's), the probe kinds, and the metrics a trainer exports."""

from __future__ import annotations

import os
import re

from ferry.producer.config import PRODUCER_ENV, read_env
from ferry.producer.status import PROBES

from .helpers import REPO
from .test_dashboard import exported_names

#: what RemoteLoader reads from its environment when the script gives none (consumer/options/resolve.py)
LOADER_ENV = {"FERRY_ENDPOINT", "FERRY_CURVE_SECRET_KEY", "FERRY_CURVE_AUTHORIZED_KEYS"}

__all__ = ["PRODUCER_ENV", "PROBES", "LOADER_ENV", "demo_env", "exported_names", "metrics_named",
           "check_producer_env", "check_trainer_env"]


def demo_env() -> set[str]:
    """The variables `ferry demo` (the trainer image's demo command) reads: its ``env("FERRY_...")`` defaults."""
    with open(os.path.join(REPO, "ferry", "demo.py")) as f:
        names = set(re.findall(r'env\("(FERRY_[A-Z_]+)"', f.read()))
    assert {"FERRY_ENDPOINT", "FERRY_DATA_DIR", "FERRY_PRODUCERS"} <= names, names
    return names


def metrics_named(query: str) -> set[str]:
    return set(re.findall(r"\bferry_[a-z_]+", query))


def check_producer_env(env: dict[str, str], where: str) -> None:
    """Every FERRY_* name in a producer container's environment is a producer variable, and every value parses."""
    ferry = {k: v for k, v in env.items() if k.startswith("FERRY_")}
    unknown = set(ferry) - set(PRODUCER_ENV)
    assert not unknown, f"{where}: not a producer variable: {sorted(unknown)}"
    read_env(ferry)  # ConfigError names a value that does not parse
    assert "FERRY_PROBE" not in env, f"{where}: FERRY_PROBE would turn the producer into a probe"


def check_trainer_env(env: dict[str, str], where: str) -> None:
    """Every FERRY_* name in a trainer container's environment is one RemoteLoader or the demo reads."""
    unknown = {k for k in env if k.startswith("FERRY_")} - LOADER_ENV - demo_env()
    assert not unknown, f"{where}: read by neither RemoteLoader nor ferry demo: {sorted(unknown)}"
