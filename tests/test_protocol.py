"""Frame 0 validation: version, type, required fields and their types."""

import msgpack
import pytest

from ferry.common import protocol
from ferry.common.constants import (
    MAX_ANNOUNCED_SHARDS, MAX_CLASS_PATH, MAX_DATASET_LEN, MAX_HEADER_BYTES, MAX_SLOTS, MAX_TASK_INDICES, MAX_TEXT, PROTOCOL_VERSION,
)
from ferry.common.errors import ProtocolError, VersionMismatch


def packed(**fields):
    return msgpack.packb(fields, use_bin_type=True)


def task(**overrides):
    fields = dict(v=PROTOCOL_VERSION, type="TASK", session=1, task=2, epoch=0, seq=3, indices=[1, 2], on_error="raise")
    fields.update(overrides)
    return packed(**fields)


def test_valid_task_parses():
    header = protocol.parse_header(task())
    assert header["indices"] == [1, 2] and header["seq"] == 3


def test_pack_and_parse_agree_for_every_type():
    hello = protocol.pack(protocol.HELLO, producer="p", nonce=1, host="h", pid=2, slots=2,
                          dataset={"spec": "s", "len": 10, "fingerprint": "f"})
    assert protocol.parse_header(hello)["type"] == "HELLO"
    for kind, fields in [
        (protocol.WELCOME, dict(session=1, heartbeat=1.0, nonce=3, frame_bytes=1, max_batch_bytes=1, codecs=[])),
        (protocol.REJECT, dict(reason="no", permanent=True)),
        (protocol.BATCH, dict(session=1, task=1, epoch=0, seq=0, tree=None, errors=[])),
        (protocol.FAIL, dict(session=1, task=1, epoch=0, seq=0,
                             errors=[{"index": 1, "exc_type": "E", "message": "m", "traceback": "t"}])),
        (protocol.PING, dict(load={})),
        (protocol.BYE, {}),
    ]:
        assert protocol.parse_header(protocol.pack(kind, **fields))["type"] == kind


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\xc1", "not valid msgpack"),
        (packed(), "version"),
        (msgpack.packb([1, 2]), "not a map"),
        (task(v=99), "version 99"),
        (task(type="NOPE"), "unknown message type"),
        (task(type=5), "unknown message type"),
        (task(indices=[-1]), "indices"),
        (task(indices=[]), "indices"),
        (task(indices="12"), "indices"),
        (task(indices=[1.5]), "indices"),
        (task(seq=True), "seq"),
        (task(seq=-1), "seq"),
        (task(session="x"), "session"),
        (task(on_error="ignore"), "on_error"),
        (packed(v=PROTOCOL_VERSION, type="TASK"), "lacks field"),
        (b"\x00" * (MAX_HEADER_BYTES + 1), "exceeds"),
        (packed(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=1, slots=10_000,
                dataset={"spec": "s", "len": 1, "fingerprint": "f"}), "slots"),
        (packed(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=1, slots=1,
                dataset={"spec": "s", "len": -1, "fingerprint": "f"}), "dataset"),
        (packed(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=1, slots=1, ahead=MAX_SLOTS + 1,
                dataset={"spec": "s", "len": 1, "fingerprint": "f"}), "ahead"),
        (packed(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=1, slots=1, ahead=-1,
                dataset={"spec": "s", "len": 1, "fingerprint": "f"}), "ahead"),
        (packed(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=1, slots=1, serial=False,
                dataset={"spec": "s", "len": 1, "fingerprint": "f"}), "serial"),  # said only when true
    ],
)
def test_invalid_headers_raise_protocol_error_with_reason(frame, reason):
    with pytest.raises(ProtocolError, match=reason):
        protocol.parse_header(frame)


def test_huge_index_list_is_refused_by_msgpack_limits():
    with pytest.raises(ProtocolError):
        protocol.parse_header(task(indices=list(range(1 << 17))))


def hello(**overrides):
    fields = dict(v=PROTOCOL_VERSION, type="HELLO", producer="p", nonce=1, host="h", pid=2, slots=2,
                  dataset={"spec": "s", "len": 10, "fingerprint": "f"})
    fields.update(overrides)
    return packed(**fields)


@pytest.mark.parametrize("frame", [
    task(session=0, task=0, epoch=0, seq=0, indices=[0]),  # zero is a valid id, epoch, seq and index
    task(seq=(1 << 63) - 1),  # the largest unsigned value the schema allows
    task(indices=list(range(MAX_TASK_INDICES))),  # the most indices a task may carry
    task(on_error="skip"),
    task(slot=[0, 1]),  # the smallest slot
    hello(slots=1),
    hello(slots=MAX_SLOTS),
    hello(dataset={"spec": "s", "len": MAX_DATASET_LEN, "fingerprint": "f"}),
    hello(producer="x" * MAX_TEXT),
    hello(shm="token"),
    hello(ahead=0), hello(ahead=MAX_SLOTS),  # none ahead, and the most
    hello(serial=True),
    packed(v=PROTOCOL_VERSION, type="PING", load={str(i): i for i in range(32)}),
    packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2,  # an int heartbeat is a number
           frame_bytes=1, max_batch_bytes=1, codecs=["lz4"] * 8),
    task(shard=[0, 1, 0, 0]),  # a sharded task of the smallest batch size
    hello(dataset={"spec": "s", "len": MAX_ANNOUNCED_SHARDS, "fingerprint": "f", "sharded": True,
                   "shard_lens": [1] * MAX_ANNOUNCED_SHARDS}),  # the most shard lengths (one more: msgpack's limit)
    packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2, frame_bytes=1, max_batch_bytes=1,
           codecs=[], pickle=True),
    packed(v=PROTOCOL_VERSION, type="BATCH", session=1, task=1, epoch=0, seq=0, tree=None, errors=[], count=0,
           last=False, batch_first=False),
    hello(dataset={"spec": "s", "len": 10, "fingerprint": "f", "iterable": True, "sized": False}),
    packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0,
           errors=[{"index": 1, "exc_type": "E", "message": "m", "traceback": "t",
                    "exc_classes": ["m:" + "E" * (MAX_CLASS_PATH - 2)]}]),  # the longest class path
])
def test_values_at_the_edge_of_every_bound_are_accepted(frame):
    protocol.parse_header(frame)


@pytest.mark.parametrize("frame, field", [
    (task(seq=1 << 63), "seq"),
    (task(indices=[1 << 63]), "indices"),
    (task(slot=[0, 0]), "slot"),
    (task(slot=[0, 1, 2]), "slot"),
    (task(slot=[-1, 5]), "slot"),
    (task(slot="0,5"), "slot"),
    (hello(slots=0), "slots"),
    (hello(slots=MAX_SLOTS + 1), "slots"),
    (hello(slots=True), "slots"),
    (hello(producer=5), "producer"),
    (hello(host=None), "host"),
    (hello(pid=-1), "pid"),
    (hello(nonce="1"), "nonce"),
    (hello(shm=7), "shm"),
    (hello(dataset={"spec": "s", "len": MAX_DATASET_LEN + 1, "fingerprint": "f"}), "dataset"),
    (hello(dataset={"spec": 1, "len": 1, "fingerprint": "f"}), "dataset"),
    (hello(dataset={"spec": "s", "len": 1, "fingerprint": None}), "dataset"),
    (hello(dataset={"spec": "s", "fingerprint": "f"}), "dataset"),
    (hello(dataset=["s", 1, "f"]), "dataset"),
    (task(shard=[0, 0, 0, 0]), "shard"),  # batch size 0
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2, frame_bytes=0, max_batch_bytes=1,
            codecs=[]), "frame_bytes"),
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2, frame_bytes=1.5, max_batch_bytes=1,
            codecs=[]), "frame_bytes"),
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2, frame_bytes=1, max_batch_bytes=1,
            codecs=[], pickle=1), "pickle"),
    (packed(v=PROTOCOL_VERSION, type="BATCH", session=1, task=1, epoch=0, seq=0, tree=None, errors=[],
            batch_first=0), "batch_first"),
    (task(shard=[0, 4, 0]), "shard"),
    (hello(dataset={"spec": "s", "len": 10, "fingerprint": "f", "sized": True}), "dataset"),  # sized, not iterable
    (hello(dataset={"spec": "s", "len": 10, "fingerprint": "f", "iterable": True, "sized": 1}), "dataset"),
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=1, nonce=2, frame_bytes=1, max_batch_bytes=0,
            codecs=[]), "max_batch_bytes"),
    (packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0,
            errors=[{"index": 1, "exc_type": "E", "message": "m", "traceback": "t",
                     "exc_classes": ["m:" + "E" * (MAX_CLASS_PATH - 1)]}]), "errors"),
    (packed(v=PROTOCOL_VERSION, type="PING", load={str(i): i for i in range(33)}), "load"),
    (packed(v=PROTOCOL_VERSION, type="PING", load=[]), "load"),
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat=True, nonce=2), "heartbeat"),
    (packed(v=PROTOCOL_VERSION, type="WELCOME", session=1, heartbeat="1", nonce=2), "heartbeat"),
    (packed(v=PROTOCOL_VERSION, type="REJECT", reason="r", permanent=1), "permanent"),
    (packed(v=PROTOCOL_VERSION, type="REJECT", reason=b"r", permanent=True), "reason"),
    (packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0, errors={}), "errors"),
    (packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0,
            errors=[{"index": 1, "exc_type": "E", "message": "m"}]), "errors"),
    (packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0,
            errors=[{"index": -1, "exc_type": "E", "message": "m", "traceback": "t"}]), "errors"),
    (packed(v=PROTOCOL_VERSION, type="FAIL", session=1, task=1, epoch=0, seq=0, errors=["boom"]), "errors"),
    (packed(v=PROTOCOL_VERSION, type="BATCH", session=1, task=1, epoch=0, seq=0, tree=None,
            errors=[{"index": 1, "exc_type": 2, "message": "m", "traceback": "t"}]), "errors"),
])
def test_a_value_just_past_a_bound_names_its_field(frame, field):
    with pytest.raises(ProtocolError, match=f"field '{field}' is invalid"):
        protocol.parse_header(frame)


@pytest.mark.parametrize("kind, field", [(kind, field) for kind, schema in protocol.SCHEMAS.items() for field in schema])
def test_every_required_field_is_required(kind, field):
    fields = {
        "HELLO": dict(producer="p", nonce=1, host="h", pid=2, slots=2, dataset={"spec": "s", "len": 1, "fingerprint": "f"}),
        "WELCOME": dict(session=1, heartbeat=1.0, nonce=3, frame_bytes=1, max_batch_bytes=1, codecs=[]),
        "REJECT": dict(reason="no", permanent=True),
        "TASK": dict(session=1, task=2, epoch=0, seq=3, indices=[1], on_error="raise"),
        "BATCH": dict(session=1, task=1, epoch=0, seq=0, tree=None, errors=[]),
        "FAIL": dict(session=1, task=1, epoch=0, seq=0, errors=[]),
        "PING": dict(load={}),
    }[kind]
    del fields[field]
    with pytest.raises(ProtocolError, match=f"{kind} lacks field '{field}'"):
        protocol.parse_header(protocol.pack(kind, **fields))


def test_the_message_types_are_their_own_names():
    names = ["HELLO", "WELCOME", "REJECT", "TASK", "BATCH", "FAIL", "PING", "BYE"]
    assert [getattr(protocol, n) for n in names] == names and set(protocol.SCHEMAS) == set(names)


def test_a_header_arrives_as_a_zmq_frame_too():
    import zmq

    frame = zmq.Frame(task())
    assert protocol.parse_header(frame)["seq"] == 3


def test_strings_come_back_as_str_and_a_long_bad_value_is_cut_in_the_message():
    header = protocol.parse_header(task(on_error="skip"))
    assert header["on_error"] == "skip" and header["type"] == "TASK"
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_header(task(on_error="x" * 500))
    shown = str(caught.value).partition("is invalid: ")[2]
    assert shown == "'" + "x" * 76 + "..."  # the value's repr, cut to 80 characters in all


def test_pack_stamps_the_protocol_version():
    header = msgpack.unpackb(protocol.pack(protocol.BYE), raw=False)
    assert header == {"v": PROTOCOL_VERSION, "type": "BYE"}


def test_a_header_of_exactly_the_size_limit_is_accepted():
    def batch(tail: int) -> bytes:
        return protocol.pack(protocol.BATCH, session=1, task=1, epoch=0, seq=0, errors=[],
                             tree=["x" * 60_000] * 17 + ["y" * tail])

    tail = 1000
    tail += MAX_HEADER_BYTES - len(batch(tail))  # str16 lengths: one more character, one more byte
    assert len(batch(tail)) == MAX_HEADER_BYTES
    assert protocol.parse_header(batch(tail))["tree"][-1] == "y" * tail
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.parse_header(batch(tail + 1))


def test_bytes_in_a_message_stay_bytes():
    raw = b"\xff\x00\xfe"  # not UTF-8: it must travel as msgpack bin, never as str
    header = protocol.parse_header(protocol.pack(protocol.BATCH, session=1, task=1, epoch=0, seq=0, errors=[],
                                                 tree={"t": "l", "v": [raw]}))
    assert header["tree"]["v"] == [raw]


def test_msgpack_extension_types_are_refused():
    frame = msgpack.packb({"v": PROTOCOL_VERSION, "type": "PING", "load": {"a": msgpack.ExtType(1, b"x")}})
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        protocol.parse_header(frame)


def test_a_bad_value_of_exactly_80_characters_is_shown_whole():
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_header(task(on_error="x" * 78))
    assert str(caught.value).partition("is invalid: ")[2] == "'" + "x" * 78 + "'"


def test_another_version_names_the_message_type_so_a_hello_can_be_told_why():
    with pytest.raises(VersionMismatch) as mismatch:
        protocol.parse_header(hello(v=99))
    assert (mismatch.value.theirs, mismatch.value.ours, mismatch.value.msg_type) == (99, PROTOCOL_VERSION, "HELLO")
