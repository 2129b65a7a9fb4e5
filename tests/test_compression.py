"""Compression for slow links (issue 12, part 3; issue 17, part 4): the frame codec, its validation, a
producer's codec per task, and real producers compressing for a RemoteLoader (loopback, ipc, and a tbf-shaped
veth link where the consumer's "auto" turns compression on). The decision itself: test_auto_compression.py."""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common import compression as comp
from ferry.common.codec import ALLOWED_DTYPES, Bfloat16Bits, Chunked, decode_tree, encode_tree
from ferry.common.errors import ConfigError, ProtocolError
from ferry.consumer.options import TransportOptions
from ferry.producer.loading.compressing import FrameCompressor
from ferry.producer.config import ProducerConfig

from .compression_datasets import Tiles
from .helpers import assert_tree_equal, free_port, wait_for
from .netns import make_shaped_link

CODECS = ("lz4", "zstd")
LIMIT = 1 << 31


def assembled(leaf):
    if isinstance(leaf, Chunked):
        return leaf.assemble_into(np.empty(leaf.nbytes, np.uint8))
    return leaf


def compressible(dtype: str, n: int = 20000) -> np.ndarray:
    values = np.arange(n) % 7
    if dtype == "|b1":
        return (values % 2).astype(bool)
    return values.astype(np.dtype(dtype))


def hand_spec(array: np.ndarray, name: str, step: int) -> tuple[dict, list]:
    """A one-leaf tree spec with its one frame compressed by ``name`` with shuffle ``step`` (0: none)."""
    raw = memoryview(array.reshape(-1).view(np.uint8))
    data = comp.shuffle(raw, step) if step else raw
    wire = comp.codec(name).compress(data)
    spec = {"t": "a", "d": array.dtype.str, "s": list(array.shape), "f": 0, "z": [[name, step, len(raw)]]}
    return spec, [wire]


# --- units: the frame codec ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
@pytest.mark.parametrize("shuffled", [False, True])
def test_roundtrip_every_dtype(name, dtype, shuffled):
    array = compressible(dtype).reshape(-1, 4)
    spec, frames = hand_spec(array, name, array.dtype.itemsize if shuffled and array.dtype.itemsize > 1 else 0)
    got = decode_tree(spec, frames, max_bytes=LIMIT)
    assert isinstance(got, np.ndarray)  # decompressed as it is decoded, on the io thread
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)


@pytest.mark.parametrize("name", CODECS)
def test_chunked_leaves_compress_per_frame_and_round_trip(name):
    array = (np.arange(300_000) % 1000).astype(np.float32).reshape(3, -1)
    labels = np.arange(3)
    spec, frames = encode_tree([array, labels], chunk_bytes=256 << 10)
    assert len(frames) > 4
    result = FrameCompressor(2)
    try:
        out = result.apply(name, spec, list(frames))
    finally:
        result.close()
    leaf = out.spec["v"][0]
    assert len(leaf["z"]) == leaf["n"] and all(e[0] == name and e[1] == 4 for e in leaf["z"])  # shuffled
    assert out.compressed == set(range(leaf["n"]))  # labels: a tiny frame, raw
    assert sum(len(f) for f in out.frames) < 0.5 * sum(len(f) for f in frames)
    tree = decode_tree(out.spec, out.frames, max_bytes=LIMIT)
    assert np.array_equal(assembled(tree[0]), array) and np.array_equal(tree[1], labels)


def test_incompressible_frames_travel_raw():
    noise = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    spec, frames = encode_tree([noise], chunk_bytes=256 << 10)
    compressor = FrameCompressor(2)
    try:
        out = compressor.apply("lz4", spec, list(frames))
    finally:
        compressor.close()
    assert out.compressed == set() and "z" not in out.spec["v"][0]
    assert all(a is b for a, b in zip(out.frames, frames))  # the very same views: nothing copied
    assert np.array_equal(assembled(decode_tree(out.spec, out.frames)[0]), noise)


def test_shuffle_is_its_own_inverse_per_itemsize():
    raw = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    for k in (2, 4, 8, 16):
        out = np.empty_like(raw)
        comp.unshuffle(comp.shuffle(raw, k), k, out)
        assert np.array_equal(out, raw)
    assert np.array_equal(comp.shuffle(np.arange(4, dtype=np.uint8), 2), np.array([0, 2, 1, 3], np.uint8))


# --- units: what a hostile peer controls ----------------------------------------------------------------
def test_wrong_raw_size_is_a_protocol_error():
    array = compressible("<f4")
    for delta in (4, -4):
        spec, frames = hand_spec(array, "lz4", 4)
        spec["z"][0][2] += delta  # the raw size no longer matches the shape
        with pytest.raises(ProtocolError, match="declared by its frames"):
            decode_tree(spec, frames, max_bytes=LIMIT)


def test_stream_shorter_or_longer_than_declared_is_caught_when_decoded():
    array = compressible("<f4")
    spec, frames = hand_spec(array, "lz4", 0)
    spec["s"], spec["z"][0][2] = [len(array) + 1], array.nbytes + 4  # consistent spec, stream 4 bytes short
    with pytest.raises(ProtocolError, match="decompresses to"):
        decode_tree(spec, frames, max_bytes=LIMIT)
    big = comp.codec("lz4").compress(bytes(1 << 20))  # 1 MiB of zeros, declared as 1000 bytes
    with pytest.raises(ProtocolError, match="does not decompress"):
        decode_tree({"t": "a", "d": "|u1", "s": [1000], "f": 0, "z": [["lz4", 0, 1000]]}, [big], max_bytes=LIMIT)


@pytest.mark.parametrize("bad, match", [
    (["gzip", 0, 80000], "unknown codec"),
    ([7, 0, 80000], "unknown codec"),
    (["lz4", 2, 80000], "bad shuffle"),
    (["lz4", 0, -1], "bad raw size"),
    (["lz4", 0], "bad compression entry"),
])
def test_malformed_entries_are_protocol_errors(bad, match):
    spec, frames = hand_spec(compressible("<f4"), "lz4", 0)
    spec["z"] = [bad]
    with pytest.raises(ProtocolError, match=match):
        decode_tree(spec, frames, max_bytes=LIMIT)
    spec["z"] = [bad, None]
    with pytest.raises(ProtocolError, match="one entry per frame"):
        decode_tree(spec, frames, max_bytes=LIMIT)


def test_compressed_slot_leaf_is_refused():
    spec, frames = hand_spec(compressible("<f4"), "lz4", 0)
    with pytest.raises(ProtocolError, match="shared-memory"):
        decode_tree({**spec, "m": 0}, frames, max_bytes=LIMIT, region=np.zeros(1 << 20, np.uint8))


@pytest.mark.parametrize("name", CODECS)
def test_a_bomb_is_refused_without_allocating(name):
    ten_gb = 10 * 10**9
    tiny = comp.codec(name).compress(b"\0" * 64)
    spec = {"t": "a", "d": "|u1", "s": [ten_gb], "f": 0, "z": [[name, 0, ten_gb]]}
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="limit"):
            decode_tree(spec, [tiny], max_bytes=LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    # within the bound, a zstd header declaring more than the spec is refused at decode (the io thread, where
    # the producer can be rejected), before anything is decompressed
    if name == "zstd":
        liar = comp.codec("zstd").compress(b"\0" * (64 << 20))
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError, match="declares 67108864 bytes"):
                decode_tree({"t": "a", "d": "|u1", "s": [4096], "f": 0, "z": [["zstd", 0, 4096]]}, [liar],
                            max_bytes=LIMIT)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20
        with pytest.raises(ProtocolError, match="not a zstd frame"):
            decode_tree({"t": "a", "d": "|u1", "s": [4096], "f": 0, "z": [["zstd", 0, 4096]]}, [b"garbage!"],
                        max_bytes=LIMIT)


# --- units: options ---------------------------------------------------------------------------------
def test_compression_option_is_checked():
    with pytest.raises(ConfigError, match="'auto', 'lz4', 'zstd' or None"):
        RemoteLoader(endpoint=None, compression="gzip", dataset_len=4)
    with pytest.raises(ConfigError, match="both given"):
        RemoteLoader(endpoint=None, compression="lz4", transport=TransportOptions(), dataset_len=4)
    assert TransportOptions().compression == "auto"
    assert TransportOptions(compression=None).compression is None
    with pytest.raises(ConfigError):
        TransportOptions(compression="brotli")
    with pytest.raises(ConfigError, match="compression"):
        ProducerConfig(endpoints=("tcp://127.0.0.1:1",), dataset="synthetic", compression="gzip")


def test_a_missing_library_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "lz4", None)
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    monkeypatch.setattr(comp, "_codecs", {})
    with pytest.raises(comp.CompressionUnavailable, match=r"pip install 'ferry\[lz4\]'"):
        RemoteLoader(endpoint=None, compression="lz4", dataset_len=4)
    with pytest.raises(ConfigError, match="lz4 package"):
        ProducerConfig(endpoints=("tcp://127.0.0.1:1",), dataset="synthetic", compression="lz4")
    assert comp.available() == ("zstd",)


# --- real producers ---------------------------------------------------------------------------------
def run_epoch(loader, producers: int = 1):
    wait_for(lambda: loader.stats()["producers"] >= producers, 60, "the producer to join")
    return [batch for batch in loader]


def served(spawn, endpoint, compression, extra=(), length=24):
    spawn(endpoint, "tests.compression_datasets:Tiles", {"length": length}, extra=extra)
    with RemoteLoader(endpoint=endpoint, batch_size=8, compression=compression, heartbeat=0.2, log_every=None,
                      timeout=60) as loader:
        batches = run_epoch(loader)
        return batches, loader.stats()


def expected_batches(length=24):
    tiles = Tiles(length)
    return [[torch.from_numpy(np.stack([tiles[i][0] for i in range(s, s + 8)])), torch.arange(s, s + 8)]
            for s in range(0, length, 8)]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_remote_producer_compresses_bit_identically(spawn, endpoint, compression):
    batches, stats = served(spawn, endpoint, compression)
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] > 0
    assert stats["uncompressed_bytes"] > 1.5 * stats["compressed_bytes"]  # what the wire saved


def test_off_and_auto_on_loopback_send_raw(spawn, endpoint):
    batches, stats = served(spawn, endpoint, None)
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] == stats["uncompressed_bytes"] == 0
    batches, stats = served(spawn, f"tcp://127.0.0.1:{free_port()}", "auto")
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] == stats["uncompressed_bytes"] == 0


def test_producer_flag_overrides_the_loader(spawn, endpoint):
    batches, stats = served(spawn, endpoint, "lz4", extra=["--compression", "none"])
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] == 0
    batches, stats = served(spawn, f"tcp://127.0.0.1:{free_port()}", None, extra=["--compression", "zstd"])
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] > 0


def test_local_producers_over_the_socket_compress_when_asked():
    with RemoteLoader(dataset=Tiles(24), local_producers=1, shared_memory=False, batch_size=8, compression="lz4",
                      log_every=None) as loader:
        batches = run_epoch(loader)
        stats = loader.stats()
    assert_tree_equal(batches, expected_batches())
    assert stats["compressed_bytes"] > 0 and stats["shared_batches"] == 0


@pytest.mark.netns
def test_auto_turns_on_over_a_slow_link(spawn, caplog):
    """The consumer tries lz4 once its loop has waited for uncompressed batches long enough to know their rate,
    and keeps it: over 200 Mbit/s the tiles arrive about twice as fast. Batches stay bit-identical throughout."""
    link = make_shaped_link("zip", rate="200mbit")
    try:
        endpoint = f"tcp://{link.addr_here}:{free_port()}"
        length = 240  # batches of 2 MiB: 30 an epoch, 80 ms each uncompressed
        spawn(endpoint, "tests.compression_datasets:Tiles", {"length": length}, slots=4, netns=link.ns)
        with RemoteLoader(endpoint=endpoint, batch_size=8, compression="auto", heartbeat=0.2, log_every=None,
                          buffer_batches=8, timeout=60) as loader:
            epochs = [run_epoch(loader) for _ in range(2)]
            stats = loader.stats()
    finally:
        link.close()
    for batches in epochs:
        assert_tree_equal(batches, expected_batches(length))
    assert "compression: trying lz4 on the remote links" in caplog.text
    assert "compression: lz4 kept" in caplog.text, caplog.text[-3000:]
    assert stats["compressed_bytes"] > 0
    assert stats["uncompressed_bytes"] > 1.5 * stats["compressed_bytes"]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_fast_path_batches_compress_from_pooled_buffers(spawn, endpoint, compression):
    """The built-in fast path writes rows into pooled buffers: once its frames are compressed the buffer goes
    back at once and is reused for the next batch, which must not change what was sent."""
    from ferry.common.datasets import SyntheticDataset

    args = {"length": 48, "shape": [4, 64, 64], "dtype": "float32"}
    data = SyntheticDataset(**args)
    spawn(endpoint, "synthetic", args, slots=3)
    with RemoteLoader(endpoint=endpoint, batch_size=8, compression=compression, heartbeat=0.2, log_every=None,
                      timeout=60) as loader:
        for _ in range(2):
            batches = run_epoch(loader)
            expected = [[torch.from_numpy(np.stack([data[i][0] for i in range(s, s + 8)])),
                         torch.tensor([data[i][1] for i in range(s, s + 8)])] for s in range(0, 48, 8)]
            assert_tree_equal(batches, expected)
        assert loader.stats()["compressed_bytes"] > 0


def test_auto_without_any_codec_library_stays_off(monkeypatch, caplog):
    from ferry.consumer.pipeline import compression_welcome

    assert compression_welcome("auto") == {"compression": "auto", "codecs": ("lz4", "zstd")}
    assert compression_welcome(None)["compression"] == "none"
    monkeypatch.setattr(comp, "available", lambda: ())
    assert compression_welcome("auto") == {"compression": "none", "codecs": ()}
    assert "stays off" in caplog.text


# --- units: a producer's codec per task ----------------------------------------------------------------
def task(compression=None):
    header = dict(session=1, task=1, epoch=0, seq=0, indices=[0], on_error="raise")
    return {**header, "compression": compression} if compression else header


def test_a_link_uses_the_codec_each_task_names_unless_overridden(caplog):
    from ferry.producer.loading.compressing import LinkCodec

    link = LinkCodec("tcp://10.0.0.2:5555", None)
    assert link.task(task("lz4")) is None  # before WELCOME: the consumer can decompress nothing we know of
    link.welcome({"codecs": ["lz4", "zstd"]})
    assert [link.task(task(c)) for c in ("zstd", None, "lz4")] == ["zstd", None, "lz4"] and link.last == "lz4"
    assert LinkCodec("tcp://10.0.0.2:5555", "auto").override is None  # --compression auto follows the tasks
    overridden = LinkCodec("tcp://10.0.0.2:5555", "none")
    overridden.welcome({"codecs": ["lz4", "zstd"]})
    assert overridden.task(task("lz4")) is None
    forced = LinkCodec("tcp://10.0.0.2:5555", "zstd")
    forced.welcome({"codecs": ["lz4", "zstd"]})
    with caplog.at_level("INFO", logger="ferry.producer"):
        assert forced.task(task()) == "zstd" and forced.task(task("lz4")) == "zstd" and forced.task(task()) == "zstd"
        assert forced.task(task("zstd")) == "zstd"
    # the flag wins over a loader's compression=None: said, once per codec asked for, never for the one it uses
    assert caplog.text.count("--compression zstd: batches to tcp://10.0.0.2:5555 use it whatever") == 2, caplog.text
    assert "one asked for none" in caplog.text and "one asked for lz4" in caplog.text
    caplog.clear()
    # a codec the consumer cannot decompress is never sent, whoever asked: it would get the producer rejected
    with caplog.at_level("WARNING", logger="ferry.producer"):
        forced.welcome({"codecs": ["lz4"]})
        assert forced.task(task()) is None and forced.task(task()) is None
    assert caplog.text.count("cannot decompress it (it has lz4)") == 1  # said once
    forced.welcome({"codecs": []})  # a WELCOME that lists no codec: nothing can be decompressed
    assert forced.task(task()) is None



def test_compression_from_the_environment():
    from ferry.producer.config import read_env

    assert read_env({"FERRY_COMPRESSION": "LZ4"}) == {"FERRY_COMPRESSION": "lz4"}
    with pytest.raises(ConfigError, match="FERRY_COMPRESSION"):
        read_env({"FERRY_COMPRESSION": "gzip"})


def test_sharded_datasets_compress_too():
    from .compression_datasets import TileShards

    data = TileShards()
    with RemoteLoader(dataset=data, local_producers=1, shared_memory=False, batch_size=4, compression="zstd",
                      log_every=None) as loader:
        batches = run_epoch(loader)
        stats = loader.stats()
    expected = []
    for shard, length in enumerate(data.lengths):
        samples = list(data.iter_shard(f"s{shard}"))
        for start in range(0, length, 4):
            part = samples[start : start + 4]
            expected.append([torch.from_numpy(np.stack([s[0] for s in part])), torch.tensor([s[1] for s in part])])
    assert_tree_equal(batches, expected)
    assert stats["compressed_bytes"] > 0


@pytest.mark.parametrize("entry, why", [
    (["brotli", 0, 4096], "unknown codec"),
    (["zstd", 0, 4096], "zstd frame declares"),  # its header says 1 MiB
    (["lz4", 0, 4096], "does not decompress"),  # sizes agree, the body is not an lz4 block
])
def test_a_producer_sending_bad_compressed_frames_is_rejected_and_its_task_reissued(spawn, endpoint, entry, why):
    import zmq

    from ferry.common import protocol

    from .helpers import dealer, hello, next_message

    ctx = zmq.Context()
    sock = dealer(ctx, endpoint)
    try:
        with RemoteLoader(endpoint=endpoint, batch_size=8, dataset_len=16, heartbeat=0.2, timeout=30,
                          log_every=None) as loader:
            sock.send(hello("hand", slots=1, length=16, fingerprint="tests.compression_datasets.Tiles:16"))
            welcome, _ = next_message(sock, protocol.WELCOME)
            assert set(welcome["codecs"]) == {"lz4", "zstd"}
            it = iter(loader)
            task, _ = next_message(sock, protocol.TASK)  # a PING may come first
            frame = comp.codec("zstd").compress(bytes(1 << 20))
            tree = {"t": "l", "v": [{"t": "a", "d": "|u1", "s": [8, 512], "f": 0, "z": [entry]},
                                    {"t": "a", "d": "<i8", "s": [8], "f": 1}]}
            sock.send_multipart([protocol.pack(protocol.BATCH, session=task["session"], task=task["task"],
                                               epoch=task["epoch"], seq=task["seq"], tree=tree, errors=[]),
                                 frame, np.arange(8, dtype=np.int64).tobytes()])
            reject, _ = next_message(sock, protocol.REJECT)
            assert reject["permanent"] and why in reject["reason"]
            spawn(endpoint, "tests.compression_datasets:Tiles", {"length": 16})
            batches = list(it)
            assert loader.stats()["invalid_messages"] >= 1
        assert_tree_equal(batches, expected_batches(16))
    finally:
        sock.close(0)
        ctx.term()


def test_shared_memory_slots_are_never_compressed():
    with RemoteLoader(dataset=Tiles(24), local_producers=1, batch_size=8, compression="lz4", log_every=None) as loader:
        batches = run_epoch(loader)
        stats = loader.stats()
    assert_tree_equal(batches, expected_batches())
    assert stats["shared_batches"] == 3 and stats["compressed_bytes"] == 0


def test_bfloat16_leaves_stay_marked_when_compressed():
    tensor = (torch.arange(40000) % 13).to(torch.bfloat16)
    spec, frames = encode_tree({"x": tensor})
    compressor = FrameCompressor(1)
    try:
        out = compressor.apply("lz4", spec, list(frames))
    finally:
        compressor.close()
    assert out.compressed == {0} and out.spec["v"][0]["x"] == "bf16"
    leaf = decode_tree(out.spec, out.frames, max_bytes=LIMIT)["x"]
    assert isinstance(leaf, Bfloat16Bits)
    assert torch.equal(torch.from_numpy(leaf).view(torch.bfloat16), tensor)
