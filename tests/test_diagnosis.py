"""diagnosis(): what bounds a run, and the periodic log line."""

import logging
import time

from ferry import RemoteLoader
from ferry.consumer.diagnosis import EpochFigures, diagnose


def figures(**kw):
    base = dict(batches=100, wait_s=5.0, active_s=10.0, producers=2, batches_by_producer={"a": 50, "b": 50},
                window_full_waits=0, idle_waits=0, waits=80)
    base.update(kw)
    return EpochFigures(**base)


def test_low_stall_is_not_data_bound():
    assert "not data-bound" in diagnose(figures(wait_s=0.5))


def test_producer_bound_names_how_many_producers():
    # 100 batches in 10 s from 2 producers: 5 batches/s each; steps take 50 ms: the loop wants 20/s
    text = diagnose(figures())
    assert "bound by the producers" in text and "about 5 producers" in text


def test_full_window_points_at_buffer_batches():
    assert "buffer_batches" in diagnose(figures(window_full_waits=70))


def test_idle_producers_point_at_transport_or_consumer():
    assert "transport or the consumer" in diagnose(figures(idle_waits=70))


def test_real_run_is_diagnosed_as_producer_bound_and_logged(endpoint, spawn, caplog):
    caplog.set_level(logging.INFO, logger="ferry")
    spawn(endpoint, "synthetic", {"length": 120, "shape": [4], "delay": 0.01}, threads=1, slots=2)
    with RemoteLoader(endpoint=endpoint, batch_size=4, buffer_batches=8, heartbeat=0.2, timeout=30,
                      log_every=0.0) as loader:
        for _ in loader:
            time.sleep(0.005)  # a fast step: one producer at ~25 batches/s cannot feed 200 steps/s
        text = loader.diagnosis()
    assert "bound by the producers" in text, text
    assert any("ferry: epoch 0 batch" in r.getMessage() and "stall" in r.getMessage() for r in caplog.records)
    assert any("bound by the producers" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
