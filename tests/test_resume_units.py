"""A loader's resume state without a loader: what ``capture_state`` saves and ``restore_state`` accepts.
The process-level tests (test_resume.py, test_iterable_datasets.py) run the same through a real loader."""

import json

import pytest

from ferry.common.errors import ConfigError
from ferry.consumer.resume import RESUME_OPTIONS, ResumePoint, capture_state, restore_state

OPTIONS = {"seed": 1, "shuffle": True, "drop_last": False, "batch_size": 8, "rank": 0, "world_size": 1,
           "in_order": True}
assert set(OPTIONS) == set(RESUME_OPTIONS)


class Sampler:
    """A sampler with its own state, as torch's stateful samplers have."""

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_an_iterable_runs_stream_positions_are_saved_and_come_back():
    state = json.loads(json.dumps(capture_state(ResumePoint(2, 7, (0, 0), (4, 3)), OPTIONS, {})))
    assert state["stream_batches"] == [4, 3]
    assert restore_state(state, OPTIONS, {}) == ResumePoint(2, 7, (0, 0), (4, 3))


def test_a_map_style_state_has_no_stream_positions():
    state = capture_state(ResumePoint(0, 3, (0, 0)), OPTIONS, {})
    assert "stream_batches" not in state
    assert restore_state(state, OPTIONS, {}).streams == ()


def test_a_samplers_own_state_is_saved_and_restored_into_the_new_sampler():
    state = json.loads(json.dumps(capture_state(ResumePoint(0, 3, (0, 0)), OPTIONS,
                                                {"sampler": Sampler(5), "batch_sampler": None})))
    assert state["sampler"] == {"position": 5} and "batch_sampler" not in state
    fresh = Sampler()
    restore_state(state, OPTIONS, {"sampler": fresh})
    assert fresh.position == 5


@pytest.mark.parametrize("streams", [[4, -1], [1.5, 2], "12", 3])
def test_stream_positions_that_are_not_batch_counts_are_refused(streams):
    state = dict(capture_state(ResumePoint(0, 3, (0, 0)), OPTIONS, {}), stream_batches=streams)
    with pytest.raises(ConfigError, match="stream_batches must be a list of batch counts"):
        restore_state(state, OPTIONS, {})


def test_a_state_of_other_options_or_out_of_order_is_refused():
    state = capture_state(ResumePoint(0, 3, (0, 0)), OPTIONS, {})
    with pytest.raises(ConfigError, match="seed=1.*2"):
        restore_state(state, dict(OPTIONS, seed=2), {})
    with pytest.raises(ConfigError, match="in_order=False"):
        restore_state(dict(state, in_order=False), OPTIONS, {})
