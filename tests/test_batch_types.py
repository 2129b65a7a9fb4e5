"""Batch types beyond plain dict / list / tuple, as units: typed containers (dict / list / tuple subclasses,
dataclasses), registered types, numpy strings and pickled values on the wire; hostile trees naming them; the
structure check of batches that are not batch-first; what the consumer core lets through from which peer; and
the producer's collation and conversion keeping classes as default_collate and default_convert do."""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
import pytest
import torch

from ferry import BatchTypeError, CollateError, ConfigError, register_batch_type
from ferry.common import protocol
from ferry.common.batch_types import Registered
from ferry.common.codec import decode_tree, encode_tree, tree_signature
from ferry.common.errors import ProtocolError
from ferry.consumer.core import Delivery
from ferry.consumer.core.admission import same_user_ipc
from ferry.consumer.core.results import BatchDecoder
from ferry.consumer.staging.tensors import CpuStager
from ferry.producer.loading.collate import RowLayout, collate
from ferry.producer.loading.convert import convert

from . import batch_type_datasets as bt
from .test_core import Loop


def round_trip(tree, pickle_ok: bool = False):
    spec, frames = encode_tree(tree, pickle_ok=pickle_ok)
    return decode_tree(spec, [bytearray(f) for f in frames], pickle_ok=pickle_ok)


def staged(tree):
    delivery = Delivery(run=1, seq=0, tree=tree, nbytes=0)
    CpuStager(pin_memory=False).stage(delivery)
    return delivery.tree


class Refusing(dict):
    """A dict subclass whose own code refuses to run: rebuilding it must not call any of it."""

    def __init__(self, *args, **kwargs):
        if kwargs.pop("allow", False) is not True:
            raise AssertionError("__init__ ran")
        super().__init__(*args, **kwargs)

    def __setitem__(self, key, value):
        raise AssertionError("__setitem__ ran")

    def update(self, *args, **kwargs):
        raise AssertionError("update ran")


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: np.ndarray
    label: int

    def __post_init__(self):
        if self.label < 0:
            raise AssertionError("__post_init__ ran")


class Pairish(tuple):
    """A tuple subclass that is not a namedtuple."""


# --- typed containers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", [
    bt.CustomDict(a=np.arange(3), b=bt.CustomList([1, "x"])),
    collections.OrderedDict([("b", 1), ("a", np.zeros(2, np.float32))]),
    collections.defaultdict(None, {"k": 2}),
    collections.Counter({"a": 3}),
    Pairish((1, np.ones(2))),
    bt.Batch(np.arange(4), np.int64(3)),
], ids=["dict-and-list-subclass", "ordereddict", "defaultdict", "counter", "tuple-subclass", "dataclass"])
def test_typed_containers_come_back_as_their_class_with_their_items(tree):
    got = round_trip(tree)
    assert type(got) is type(tree)
    plain = dataclasses.asdict(tree) if dataclasses.is_dataclass(tree) else tree
    back = dataclasses.asdict(got) if dataclasses.is_dataclass(got) else got
    assert list(back) == list(plain) if isinstance(plain, dict) else len(back) == len(plain)
    for g, e in zip(back.values() if isinstance(back, dict) else back,
                    plain.values() if isinstance(plain, dict) else plain):
        assert np.array_equal(g, e) if isinstance(e, np.ndarray) else g == e
    if isinstance(tree, bt.CustomDict):
        assert type(got["b"]) is bt.CustomList


def test_rebuilding_a_typed_container_runs_none_of_its_class_s_code():
    got = round_trip(Refusing({"a": 1}, allow=True))
    assert type(got) is Refusing and dict(got) == {"a": 1}
    spec, frames = encode_tree(Frozen(np.arange(2), 1))
    spec["v"][0]["v"][1] = -1  # a label its __post_init__ would refuse: set as sent
    got = decode_tree(spec, [bytes(f) for f in frames])
    assert type(got) is Frozen and got.label == -1


def test_staging_keeps_typed_containers_and_namedtuples_and_makes_tensors_inside_them():
    data = torch.tensor([1.0, 2.0, 3.0])
    packed = torch.nn.utils.rnn.PackedSequence(data, torch.tensor([2, 1]), None, None)
    got = staged(round_trip(bt.CustomDict(p=packed, r=Refusing({"x": np.arange(2)}, allow=True))))
    assert type(got) is bt.CustomDict and type(got["p"]) is torch.nn.utils.rnn.PackedSequence
    assert torch.equal(got["p"].data, data) and got["p"].sorted_indices is None
    assert type(got["r"]) is Refusing and torch.equal(got["r"]["x"], torch.arange(2))


@pytest.mark.parametrize("name,inner,kind", [
    ("not_imported_anywhere.models:Thing", {"t": "d", "k": ["a"], "v": [1]}, dict),
    (f"{bt.__name__}:CustomList", {"t": "d", "k": ["a"], "v": [1]}, dict),  # a list class for a dict
    (f"{bt.__name__}:Batch", {"t": "d", "k": ["other"], "v": [1]}, dict),  # other fields than the dataclass's
    ("torch:Size", {"t": "t", "v": [1, 2]}, tuple),  # a builtin subclass: not rebuilt without its own code
    (f"{Frozen.__module__}:Frozen.__init__", {"t": "d", "k": ["x"], "v": [1]}, dict),  # not a class
], ids=["unknown", "kind", "fields", "builtin", "not-a-class"])
def test_a_typed_container_the_receiver_cannot_rebuild_stays_its_plain_container(name, inner, kind):
    assert type(decode_tree({"t": "c", "c": name, "v": [inner]}, [])) is kind


def test_class_names_are_looked_up_never_imported():
    name = "ferry_never_imported_module:Thing"
    assert type(decode_tree({"t": "c", "c": name, "v": [{"t": "l", "v": []}]}, [])) is list
    assert "ferry_never_imported_module" not in __import__("sys").modules


@pytest.mark.parametrize("spec", [
    {"t": "c", "c": "m:X", "v": [{"t": "l", "v": []}, {"t": "l", "v": []}]},
    {"t": "c", "c": "m:X", "v": [3]},
    {"t": "c", "c": "no-colon", "v": [{"t": "l", "v": []}]},
    {"t": "c", "c": "m:" + "X" * 300, "v": [{"t": "l", "v": []}]},
    {"t": "c", "c": "m:X"},
    {"t": "r", "c": 5, "v": [1]},
    {"t": "g", "d": "object_", "v": "a"},
    {"t": "g", "d": "str_", "v": b"bytes"},
    {"t": "p", "f": 0},
], ids=["two-children", "leaf-child", "name-form", "name-long", "no-values", "registered-name", "numpy-kind",
        "numpy-value", "pickled"])
def test_hostile_typed_nodes_are_protocol_errors(spec):
    with pytest.raises(ProtocolError):
        decode_tree(spec, [b"\x80\x04K\x01."] if spec["t"] == "p" else [])


def test_a_pickled_value_is_refused_without_leave_and_its_frame_is_never_unpickled():
    class Boom:
        def __reduce__(self):
            return (os.system, ("exit 1",))

    spec, frames = encode_tree({"x": [object()]}, pickle_ok=True)
    assert spec["v"][0]["v"][0] == {"t": "p", "f": 0}
    with pytest.raises(ProtocolError, match=r"batch\['x'\]\[0\].*only the consumer's local producers"):
        decode_tree(spec, [bytes(f) for f in frames])
    assert type(decode_tree(spec, [bytes(f) for f in frames], pickle_ok=True)["x"][0]) is object
    with pytest.raises(ProtocolError):
        decode_tree(*encode_tree(Boom(), pickle_ok=True))  # refused before anything is unpickled


def test_arrays_that_cannot_travel_as_bytes_are_pickled_only_with_leave():
    strings = np.array(["a", "bc"])
    with pytest.raises(ProtocolError, match="cannot travel"):
        encode_tree(strings)
    assert np.array_equal(round_trip(strings, pickle_ok=True), strings)


def test_numpy_string_scalars_stay_numpy_strings():
    got = round_trip([np.str_("a"), np.bytes_(b"b"), "c"])
    assert [type(v) for v in got] == [np.str_, np.bytes_, str] and got == ["a", b"b", "c"]


# --- registered types ---------------------------------------------------------------------------------------
def test_a_registered_type_is_rebuilt_by_from_tree_after_staging_with_tensors():
    pair = bt.RegisteredPair(torch.arange(6).view(2, 3), torch.tensor([1, 0]))
    spec, frames = encode_tree(pair)
    assert spec["t"] == "r" and spec["c"] == "tests.batch_type_datasets:RegisteredPair"
    decoded = decode_tree(spec, [bytearray(f) for f in frames])
    assert type(decoded) is Registered and tree_signature(decoded, 2)[:2] == ("r", spec["c"])
    got = staged(decoded)
    assert type(got) is bt.RegisteredPair and torch.equal(got.inputs, pair.inputs)
    assert torch.equal(got.targets, pair.targets)


def test_a_registered_type_unknown_here_is_a_batch_type_error_naming_it_and_the_call():
    spec = {"t": "r", "c": "elsewhere.models:Thing", "v": [{"t": "l", "v": []}]}
    with pytest.raises(BatchTypeError, match=r"'elsewhere.models:Thing'.*not registered in this process.*"
                                             r"ferry\.register_batch_type"):
        decode_tree(spec, [])


def test_registration_refuses_what_it_cannot_honour():
    class Mine:
        pass

    with pytest.raises(ConfigError, match="not a class"):
        register_batch_type(Mine(), lambda o: o, lambda t: t)
    with pytest.raises(ConfigError, match="to_tree"):
        register_batch_type(Mine, None, lambda t: t)
    with pytest.raises(ConfigError, match="itself"):
        register_batch_type(dict, lambda o: o, lambda t: t)
    with pytest.raises(ConfigError, match="itself"):
        register_batch_type(torch.Tensor, lambda o: o, lambda t: t)
    with pytest.raises(ConfigError, match="is registered for"):
        register_batch_type(Mine, lambda o: o, lambda t: t, name="tests.batch_type_datasets:RegisteredPair")
    with pytest.raises(ConfigError, match="module:qualname"):
        register_batch_type(Mine, lambda o: o, lambda t: t, name="no colon")


# --- the structure check of batches that are not batch-first ------------------------------------------------
def _header(spec, batch_first: bool | None) -> dict:
    header = {"epoch": 0, "seq": 0, "task": 1, "tree": spec, "errors": []}
    if batch_first is not None:
        header["batch_first"] = batch_first
    return header


def _decode(decoder: BatchDecoder, tree, batch_first: bool | None, count: int = 4):
    spec, frames = encode_tree(tree)
    return decoder.decode(_header(spec, batch_first), [bytes(f) for f in frames], seq=0, epoch=0,
                          indices=list(range(count)), region=None)


def test_a_batch_that_is_not_batch_first_is_checked_for_its_structure_not_its_counts():
    decoder = BatchDecoder(1 << 20)

    def detection(n):
        return tuple(np.zeros((3, 4)) for _ in range(n)), tuple({"b": np.zeros((n, 4))} for _ in range(n))

    _decode(decoder, detection(4), False)
    _decode(decoder, detection(3), False, count=3)  # tuples of 3, 3 rows: lengths are data here
    with pytest.raises(ProtocolError, match="structure"):
        _decode(decoder, [np.zeros(4)], False)  # a list where the first had a tuple
    mixed = BatchDecoder(1 << 20)
    _decode(mixed, [np.zeros(4)], False)
    with pytest.raises(ProtocolError, match="structure"):
        _decode(mixed, [np.zeros(4)], None)  # the same tree claiming Ferry's collation: another structure
    strict = BatchDecoder(1 << 20)
    with pytest.raises(ProtocolError, match=r"batch\[0\]\[0\] holds 3 samples, the task 4"):
        _decode(strict, detection(4), None)  # batch-first is checked where the producer does not say otherwise


# --- the consumer core: who may send what -------------------------------------------------------------------
def test_only_an_ipc_peer_of_this_user_may_send_pickled_values():
    uid = os.getuid()
    assert same_user_ipc(f"localhost:{uid}:{os.getgid()}:123")
    assert not same_user_ipc(f"localhost:{uid + 1}:0:123")
    for address in ("127.0.0.1", "::1", "[::1]", "10.0.0.5", "fe80::1:2:3%eth0", "", None, "localhost:a:b:c"):
        assert not same_user_ipc(address), address


def _hello_from(loop: Loop, peer: bytes, address: str) -> dict:
    hello = protocol.pack(protocol.HELLO, producer=peer.decode(), nonce=1, host="h", pid=1, slots=2,
                          dataset={"spec": "s", "len": loop.length, "fingerprint": "f"})
    loop.apply(loop.core.received([peer, hello], loop.now, address=address))
    return [h for p, h, _ in loop.sent if p == peer and h["type"] == protocol.WELCOME][-1]


def _pickled_batch(loop: Loop, peer: bytes, address: str) -> None:
    task = loop.tasks(peer)[0]
    spec, frames = encode_tree([np.zeros(1, np.float32), object()], pickle_ok=True)
    batch = protocol.pack(protocol.BATCH, session=task["session"], task=task["task"], epoch=task["epoch"],
                          seq=task["seq"], tree=spec, errors=[], batch_first=False)
    loop.apply(loop.core.received([peer, batch, *[bytes(f) for f in frames]], loop.now, address=address))


def test_a_pickled_value_is_accepted_from_a_local_producer_and_refuses_a_producer_over_tcp():
    local = Loop(capacity=1)
    assert _hello_from(local, b"a", f"localhost:{os.getuid()}:0:42").get("pickle") is True
    local.start()
    _pickled_batch(local, b"a", f"localhost:{os.getuid()}:0:42")
    assert type(local.take().tree[1]) is object and b"a" in local.core.dispatcher.producers
    remote = Loop(capacity=1)
    assert "pickle" not in _hello_from(remote, b"b", "127.0.0.1")
    remote.start()
    _pickled_batch(remote, b"b", "127.0.0.1")
    reject = [h for p, h, _ in remote.sent if p == b"b" and h["type"] == protocol.REJECT]
    assert reject and reject[0]["permanent"] and "pickled" in reject[0]["reason"]
    assert remote.delivered == [] and b"b" not in remote.core.dispatcher.producers


def test_a_registered_type_the_trainer_lacks_is_raised_at_its_batch_and_its_producer_kept():
    loop = Loop(capacity=2)
    loop.hello(b"a", slots=2)
    loop.start()
    first, second = loop.tasks(b"a")
    spec = {"t": "r", "c": "elsewhere:Thing", "v": [{"t": "l", "v": []}]}
    loop.receive(b"a", dict(type=protocol.BATCH, session=77, task=first["task"], epoch=0, seq=first["seq"],
                            tree=spec, errors=[], batch_first=False))
    loop.answer(b"a", second)
    got = loop.batches()
    assert isinstance(got[0], BatchTypeError) and "elsewhere:Thing" in str(got[0]) and got[1] == [1.0]
    assert b"a" in loop.core.dispatcher.producers and loop.counters.invalid_messages == 0


# --- the producer's collation and conversion ----------------------------------------------------------------
def test_collation_keeps_dict_and_list_subclasses_in_both_paths():
    samples = [bt.CustomDict(x=np.full(3, i, np.float32), pair=bt.CustomList([np.float32(i), i])) for i in range(3)]
    expected = collate(samples)
    assert type(expected) is bt.CustomDict and type(expected["pair"]) is bt.CustomList
    layout = RowLayout.learn(samples[0])
    dests = layout.destinations(3, lambda n: np.empty(n, np.uint8))
    rows = [layout.write(s, dests, i) for i, s in enumerate(samples)]
    got = layout.assemble(rows, dests)
    assert type(got) is bt.CustomDict and type(got["pair"]) is bt.CustomList
    assert np.array_equal(got["x"], expected["x"]) and np.array_equal(got["pair"][1], expected["pair"][1])


def test_collation_leaves_numpy_strings_and_its_errors_are_type_and_runtime_errors():
    assert collate([np.str_("a"), np.str_("b")]) == ["a", "b"]
    assert all(type(v) is np.str_ for v in collate([np.str_("a"), np.str_("b")]))
    with pytest.raises(CollateError) as caught:
        collate([["X"], ["X", "X"]])
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, RuntimeError)


@pytest.mark.parametrize("sample,expected", [
    ((np.arange(2), 3), [np.arange(2), 3]),
    (bt.CustomList([np.float32(1.5), "s"]), bt.CustomList([np.asarray(np.float32(1.5)), "s"])),
    (range(2), [0, 1]),
    (np.array(["a"]), np.array(["a"])),
    (np.str_("a"), np.str_("a")),
], ids=["tuple", "list-subclass", "range", "string-array", "numpy-string"])
def test_an_unbatched_sample_is_converted_as_default_convert_converts_it(sample, expected):
    got = convert(sample)
    assert type(got) is type(expected)
    for g, e in zip(got, expected) if isinstance(expected, list) else [(got, expected)]:
        assert type(g) is type(e) and np.array_equal(g, e)


def test_a_from_tree_that_raises_fails_its_batch_not_the_staging_thread():
    import queue
    import threading

    from ferry.consumer.staging.stagers import staging_loop

    class Fragile:
        pass

    def refuse(tree):
        raise ValueError("cannot rebuild")

    register_batch_type(Fragile, lambda obj: {"x": np.zeros(2)}, refuse)
    handoff, out, stop, failure = queue.Queue(), queue.Queue(), threading.Event(), []
    bad = Delivery(run=1, seq=0, tree=round_trip(Fragile()), nbytes=16)
    good = Delivery(run=1, seq=1, tree=round_trip({"x": np.arange(2)}), nbytes=16)
    for item in (bad, good):
        handoff.put(item)
    thread = threading.Thread(target=staging_loop, args=(handoff, out, stop, CpuStager(pin_memory=False), failure))
    thread.start()
    try:
        first, second = out.get(timeout=30), out.get(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and failure == []
    assert isinstance(first.error, BatchTypeError) and "Fragile" in str(first.error) and first.tree is None
    assert isinstance(first.error.__cause__, ValueError)
    assert second.error is None and torch.equal(second.tree["x"], torch.arange(2))
