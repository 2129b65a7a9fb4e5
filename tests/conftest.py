import logging

import pytest

from . import needs
from .helpers import LeakCheck, ProducerProcess, free_port


@pytest.fixture
def endpoint() -> str:
    """A fresh loopback endpoint for a consumer to bind."""
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def spawn():
    """Start real producer processes; every one is killed and reaped at teardown."""
    started: list[ProducerProcess] = []

    def start(*args, **kwargs) -> ProducerProcess:
        process = ProducerProcess(*args, **kwargs)
        started.append(process)
        return process

    start.started = started  # for failure reports
    yield start
    for process in started:
        process.close()


@pytest.fixture
def needs_shared_memory() -> None:
    """For a test that needs the shared-memory slab: skipped where there is none, failed under CI=true
    (``pytestmark = pytest.mark.usefixtures("needs_shared_memory")``)."""
    needs.shared_memory()


@pytest.fixture
def leak_check():
    check = LeakCheck()
    yield check


@pytest.fixture(autouse=True)
def _quiet_ferry_logs(caplog):
    caplog.set_level(logging.INFO, logger="ferry")
