"""Issue 19, part 5: ``--log-format json`` (FERRY_LOG_FORMAT) makes every line a producer writes one JSON object
with time, level, logger, message and the event's fields, for an engine's log collector."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

from ferry import RemoteLoader

from .helpers import REPO, producer_env


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` as JSON (a line that is not JSON fails the test, naming it)."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return records


def test_every_line_of_a_producers_life_is_a_json_event(endpoint, spawn):
    producer = spawn(endpoint, "synthetic", {"length": 8, "shape": [4]}, env={"FERRY_LOG_FORMAT": "json"})
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, log_every=None) as loader:
        assert len(list(loader)) == 2
        assert producer.terminate() == 0
    records = json_lines(producer.output())
    for record in records:
        assert {"time", "level", "logger", "message", "pid"} <= set(record), record
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), record["time"]
        assert record["pid"] == producer.pid and record["logger"].startswith("ferry")
    events = {record.get("event"): record for record in records}
    assert events["start"]["dataset"] == "synthetic" and events["start"]["endpoints"] == [endpoint]
    assert events["welcomed"]["endpoint"] == endpoint and events["welcomed"]["level"] == "INFO"
    assert re.fullmatch(r"[0-9a-f]+", events["welcomed"]["session"])
    assert events["stop"]["exit_code"] == 0 and events["stop"]["batches_sent"] == 2


def test_a_configuration_error_is_one_json_line_with_its_exit_status(endpoint):
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset", "synthetic",
                          "--slots", "0", "--log-format", "json"], env=producer_env(), capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 2
    [record] = json_lines(out.stderr)
    assert record["level"] == "ERROR" and "slots must be" in record["message"]
    assert record["event"] == "exit" and record["exit_code"] == 2 and record["failure"] == "configuration"


def test_a_traceback_stays_inside_its_json_line():
    from ferry.producer.logs import JsonLines, fields

    try:
        raise KeyError("x")
    except KeyError:
        record = logging.getLogger("ferry.producer").makeRecord(
            "ferry.producer", logging.CRITICAL, __file__, 1, "crash %s", ("now",), sys.exc_info(),
            extra=fields(event="exit", exit_code=1, message="not over the message"))
    line = JsonLines().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "crash now" and parsed["event"] == "exit" and parsed["exit_code"] == 1
    assert parsed["traceback"].startswith("Traceback") and "KeyError: 'x'" in parsed["traceback"]


def test_a_plain_line_starts_with_its_utc_time_to_the_millisecond():
    """The plain format's lines carry the time (UTC, as the JSON lines' ``time``), so that an operator can line
    up producers on several hosts with the trainer's log."""
    from ferry.producer.logs import PlainLines

    record = logging.getLogger("ferry.producer").makeRecord(
        "ferry.producer", logging.WARNING, __file__, 1, "no consumer answered %s", ("tcp://a:1",), None)
    record.created, record.msecs = 1796131427.677, 677.0  # 2026-12-01 13:23:47.677 UTC
    line = PlainLines().format(record)
    assert line == f"2026-12-01T13:23:47.677Z ferry-producer[{os.getpid()}] WARNING no consumer answered tcp://a:1"
