"""Issue 19, part 5: a producer's exit status names its failure class (producer/exits.py), for an engine to act on:
0 stopped, 1 a bug, 2 configuration, 3 rejected by every consumer, 4 the dataset failed to open. The process-level
cases live where their behaviour does: tests/test_cli.py (2 and 4), tests/test_admission.py (3), tests/test_drain.py
and tests/test_cli.py (0)."""

from __future__ import annotations

import logging

import pytest

from ferry.common.errors import ConfigError, DatasetError, DatasetOpenError, DatasetSpecError, MissingExtraError
from ferry.producer import cli
from ferry.producer.exits import EXIT_STATUSES, describe_statuses, failure_status


@pytest.mark.parametrize("exc, status", [
    (ConfigError("slots must be >= 1"), 2),
    (DatasetSpecError("cannot import module"), 2),
    (MissingExtraError("pip install 'ferry[images]'"), 2),
    (DatasetOpenError("npy-folder root '/data' is not a directory"), 4),
    (RuntimeError("a bug"), 1),
    (KeyError("a bug"), 1),
])
def test_each_failure_has_its_status(exc, status):
    assert failure_status(exc) == status


def test_the_help_lists_every_status():
    text = cli.build_parser().format_help()
    assert [code for code, _ in EXIT_STATUSES] == [0, 1, 2, 3, 4, 5]
    assert describe_statuses() in text


def test_a_dataset_error_while_opening_is_status_4_and_a_bad_argument_stays_2(monkeypatch):
    from ferry import producer

    def fails(error):
        def resolve(spec, args):
            raise error
        return resolve

    config = producer.ProducerConfig(endpoints=("tcp://127.0.0.1:1",), dataset="x:y")
    import ferry.common.datasets as datasets

    for error, expected in [(DatasetError("packed index is corrupt"), DatasetOpenError),
                            (OSError("stale NFS handle"), DatasetOpenError),
                            (ConfigError("length must be >= 0"), ConfigError)]:
        monkeypatch.setattr(datasets, "resolve_dataset", fails(error))
        with pytest.raises(expected) as raised:
            producer._opened(config, None)  # PRIVATE: serve's opening step (serve itself sets process-wide malloc)
        assert failure_status(raised.value) == (4 if expected is DatasetOpenError else 2)


def test_an_unexpected_error_is_status_1_with_its_traceback_logged(monkeypatch, caplog):
    import ferry.producer as producer_package

    def crash(config):
        raise ZeroDivisionError("a bug in the loop")

    monkeypatch.setattr(producer_package, "serve", crash)
    monkeypatch.setattr(cli, "configure_logging", lambda level, log_format: None)  # pytest's capture stays
    with caplog.at_level(logging.CRITICAL, logger="ferry.producer"):
        assert cli.main(["--connect", "tcp://127.0.0.1:1", "--dataset", "synthetic"]) == 1
    [record] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert record.getMessage() == "unexpected error, exiting 1: ZeroDivisionError: a bug in the loop"
    assert record.exc_info[0] is ZeroDivisionError and record.fields["exit_code"] == 1
