"""A sharded dataset's shard lengths in the producer's HELLO (``dataset.shard_lens``): checked on receipt, adopted
from the first producer, and a producer whose shards hold other counts is refused. No sockets."""

from __future__ import annotations

import pytest

from ferry.common import protocol
from ferry.common.constants import MAX_ANNOUNCED_SHARDS
from ferry.common.errors import ConfigTypeError, ProtocolError
from ferry.common.shardplan import announced_shard_lengths
from ferry.consumer.core.admission import Peers
from ferry.consumer.core.dispatcher import Dispatcher
from tests.shard_datasets import Shards, SizedShards


def hello(lengths, *, producer="p", count=3, sharded=True, fingerprint="f") -> dict:
    dataset = {"spec": "tar-shards", "len": count, "fingerprint": fingerprint, "shard_lens": lengths}
    if sharded:
        dataset["sharded"] = True
    return protocol.parse_header(protocol.pack(protocol.HELLO, producer=producer, nonce=1, host="h", pid=1, slots=2,
                                               dataset=dataset))


def test_shard_lens_must_be_one_count_per_shard_of_a_sharded_dataset():
    assert hello([5, 0, 7])["dataset"]["shard_lens"] == [5, 0, 7]
    for bad in ([5, 0], [5, 0, -1], [5, 0, 1.5], [5, 0, True], "5,0,7"):
        with pytest.raises(ProtocolError, match="dataset"):
            hello(bad)
    with pytest.raises(ProtocolError, match="dataset"):
        hello([5, 0, 7], sharded=False)


def test_the_first_producer_sets_the_lengths_and_one_that_counts_otherwise_is_refused():
    peers = Peers(Dispatcher(10, max_attempts=3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0)
    assert peers.admit(b"a", hello([5, 0, 7], producer="a"), now=1.0).reject is None
    assert peers.shard_lengths == [5, 0, 7]
    assert peers.admit(b"b", hello([5, 0, 7], producer="b"), now=1.0).reject is None
    refused = peers.admit(b"c", hello([5, 1, 7], producer="c"), now=1.0).reject
    assert refused == ("its shards hold other sample counts than the first producer's (h:1), under the same "
                       "fingerprint 'f': has a shard been rewritten?")
    assert peers.shard_lengths == [5, 0, 7] and len(peers.dispatcher.producers) == 2


def test_a_producer_announces_shard_len_where_the_dataset_gives_it():
    assert announced_shard_lengths(SizedShards(lengths=(3, 0, 9))) == [3, 0, 9]
    assert announced_shard_lengths(Shards(lengths=(3, 0, 9))) is None  # no shard_len: len(loader) is not known
    assert announced_shard_lengths(SizedShards(lengths=(1,) * (MAX_ANNOUNCED_SHARDS + 1))) is None

    class Broken(SizedShards):
        def shard_len(self, name):
            raise OSError("unreadable")

    class Lying(SizedShards):
        def shard_len(self, name):
            return "3"

    assert announced_shard_lengths(Broken(lengths=(3, 4))) is None
    with pytest.raises(ConfigTypeError, match="must return an int"):
        announced_shard_lengths(Lying(lengths=(3, 4)))
