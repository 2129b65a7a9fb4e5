"""Errors keep their type (issue 18, part 2): what ``__getitem__``, a transform or ``collate_fn`` raised on a
producer is raised in the trainer as its own type where that type can be rebuilt, as DataLoader's
``ExceptionWrapper`` does, and it is a ``RemoteSampleError`` too, with Ferry's context. Nothing is pickled on
the wire and no module a peer names is ever imported. Real producers for the loop; the rebuilding rules as a
unit."""

from __future__ import annotations

import pickle
import sys

import pytest

from ferry import RemoteLoader, RemoteSampleError
from ferry.common import protocol
from ferry.common.errors import FerryError, ProtocolError
from ferry.common.remote_errors import class_path, exception_classes, typed_remote_error

from tests.lifecycle_datasets import LabelMissing, Raising, collate_raising_type_error


def _first_error(dataset, **kwargs) -> BaseException:
    with RemoteLoader(dataset=dataset, local_producers=1, batch_size=4, timeout=30, **kwargs) as loader:
        with pytest.raises(RemoteSampleError) as caught:
            for _ in loader:
                pass
    return caught.value


def _context(error: BaseException, index: int) -> None:
    assert isinstance(error, RemoteSampleError) and isinstance(error, FerryError)
    assert error.index == index and error.producer and "Traceback" in error.remote_traceback
    assert str(error).startswith(f"sample {index} failed on producer {error.producer}")


@pytest.mark.parametrize("dataset", [Raising(kind="KeyError"), "tests.lifecycle_datasets:Raising"],
                         ids=["forked", "spawned-by-spec"])
def test_a_key_error_in_getitem_is_caught_by_except_key_error(dataset):
    with RemoteLoader(dataset=dataset, local_producers=1, batch_size=4, timeout=30) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(KeyError) as caught:
            next(it)
    error = caught.value
    _context(error, 5)
    assert error.exc_type == "KeyError" and error.message == "'label of sample 5'"
    assert not str(error).startswith("'"), "KeyError's repr quirk must not wrap the message in quotes"
    assert "label of sample 5" in str(error) and "remote traceback" in str(error)


def test_a_type_error_in_collate_fn_is_caught_by_pytest_raises_type_error():
    with RemoteLoader(dataset=Raising(bad=-1), local_producers=1, batch_size=4, timeout=30,
                      collate_fn=collate_raising_type_error) as loader:
        with pytest.raises(TypeError, match="cannot collate 4 samples of type tuple"):
            next(iter(loader))


def test_a_stop_iteration_in_getitem_raises_in_the_loop_and_never_ends_it_quietly():
    """Issue 30, point 8: rebuilt as a StopIteration, the error would end ``for batch in loader`` mid-epoch without
    a word (batches 0 and 1 delivered, the epoch "done"). It comes back as a RemoteSampleError that is not one."""
    delivered = 0
    with RemoteLoader(dataset=Raising(kind="StopIteration"), local_producers=1, batch_size=2, timeout=30) as loader:
        with pytest.raises(RemoteSampleError) as caught:
            for _ in loader:
                delivered += 1
    assert delivered == 2, "the batches before sample 5's must come, and the loop must not end at it"
    assert not isinstance(caught.value, StopIteration)
    assert caught.value.exc_type == "StopIteration" and caught.value.index == 5


def test_a_user_exception_class_importable_here_comes_back_as_itself():
    error = _first_error(Raising(kind="LabelMissing"))
    assert isinstance(error, LabelMissing) and isinstance(error, KeyError)
    _context(error, 5)
    assert type(error).__name__ == "LabelMissing"


def test_a_class_whose_constructor_needs_more_comes_back_as_its_nearest_buildable_base():
    error = _first_error(Raising(kind="NeedsTwo"))
    assert isinstance(error, ValueError) and error.exc_type == "NeedsTwo"
    _context(error, 5)
    assert "/data/5.jpg: code 7" in str(error)


def test_unicode_decode_error_comes_back_as_a_value_error():
    error = _first_error(Raising(kind="UnicodeDecodeError"))
    assert isinstance(error, ValueError) and error.exc_type == "UnicodeDecodeError"


def test_a_class_of_a_module_the_trainer_never_imported_is_not_imported_and_comes_back_as_its_base():
    sys.modules.pop("tests.unimported_errors", None)
    error = _first_error(Raising(kind="Unimported"))
    assert "tests.unimported_errors" not in sys.modules, "a module named by a producer was imported"
    assert isinstance(error, OSError) and error.exc_type == "DecoderError"
    _context(error, 5)


def test_on_error_skip_is_unchanged():
    with RemoteLoader(dataset=Raising(kind="KeyError"), local_producers=1, batch_size=4, timeout=30,
                      on_error="skip") as loader:
        labels = [int(i) for _, y in loader for i in y]
    assert labels == [i for i in range(16) if i != 5]


# --- the rebuilding rules, as a unit ----------------------------------------------------------------------
def _rebuilt(classes: list[str], exc_type: str = "X") -> RemoteSampleError:
    return typed_remote_error(classes, index=3, producer="h:1", exc_type=exc_type, message="m", traceback="tb",
                              epoch=0, seq=1)


def test_exception_classes_names_the_chain_down_to_exception():
    assert exception_classes(LabelMissing("x")) == [
        "tests.lifecycle_datasets:LabelMissing", "builtins:KeyError", "builtins:LookupError"]
    assert class_path(KeyError) == "builtins:KeyError"
    assert exception_classes(Exception("x")) == []


@pytest.mark.parametrize("classes,expected", [
    (["builtins:KeyError"], KeyError),
    (["builtins:FileNotFoundError", "builtins:OSError"], FileNotFoundError),
    (["nowhere.at.all:Boom", "builtins:RuntimeError"], RuntimeError),
    (["builtins:KeyboardInterrupt"], None),  # not an Exception: never raised in the trainer
    (["builtins:SystemExit"], None),
    (["builtins:StopIteration"], None),  # raised in the loop, it would end `for batch in loader` quietly
    (["builtins:StopAsyncIteration"], None),
    (["os:system"], None),  # not a class
    (["builtins:__import__"], None),
    (["ferry.common.errors:RemoteSampleError"], None),
    (["builtins:Exception"], None),
    (["not a path"], None),
    ([], None),
], ids=lambda v: repr(v)[:40])
def test_only_exception_classes_already_loaded_are_rebuilt(classes, expected):
    before = set(sys.modules)
    error = _rebuilt(classes)
    assert set(sys.modules) == before
    assert isinstance(error, RemoteSampleError)
    if expected is None:
        assert type(error) is RemoteSampleError
    else:
        assert isinstance(error, expected) and type(error).__mro__[1] is expected
        assert type(error) is type(_rebuilt(classes)), "the subclass is made once and reused"


def test_a_rebuilt_error_pickles_back_to_the_same_type_and_text():
    error = _rebuilt(["builtins:KeyError"], exc_type="KeyError")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.index == 3
    plain = pickle.loads(pickle.dumps(_rebuilt([])))
    assert type(plain) is RemoteSampleError


def test_a_fail_record_with_a_malformed_class_list_is_a_protocol_error():
    base = {"index": 1, "exc_type": "KeyError", "message": "m", "traceback": "t"}

    def fail(record):
        return protocol.pack(protocol.FAIL, session=1, task=1, epoch=0, seq=0, errors=[record])

    assert protocol.parse_header(fail({**base, "exc_classes": ["builtins:KeyError"]}))["errors"][0]["exc_classes"]
    for bad in ("builtins:KeyError", [1], ["x"] * 100, ["a" * 5000]):
        with pytest.raises(ProtocolError, match="errors"):
            protocol.parse_header(fail({**base, "exc_classes": bad}))
