"""Frame 0 validation: version, type, required fields and their types."""

import msgpack
import pytest

from ferry.common import protocol
from ferry.common.constants import MAX_HEADER_BYTES, PROTOCOL_VERSION
from ferry.common.errors import ProtocolError


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
        (protocol.WELCOME, dict(session=1, heartbeat=1.0, nonce=3)),
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
    ],
)
def test_invalid_headers_raise_protocol_error_with_reason(frame, reason):
    with pytest.raises(ProtocolError, match=reason):
        protocol.parse_header(frame)


def test_huge_index_list_is_refused_by_msgpack_limits():
    with pytest.raises(ProtocolError):
        protocol.parse_header(task(indices=list(range(1 << 17))))
