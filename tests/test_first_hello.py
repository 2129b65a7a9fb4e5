"""A producer started before its consumer binds says HELLO the moment libzmq connects, not a heartbeat later.

Local producers are forked before the loader binds its ROUTER, so their first HELLO always finds no
connection (the DEALER has IMMEDIATE set). A real producer runs here with a 30 s heartbeat against a
hand-made consumer (a raw ROUTER) that binds only once the producer's first HELLO has failed. Under the
tick schedule alone the next HELLO would come 30 s later; the producer watches its socket for POLLOUT
instead, so exactly one HELLO arrives, long before any heartbeat could have sent one.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import zmq

from ferry.common import protocol
from ferry.common.datasets import SyntheticDataset
from ferry.producer import ProducerConfig
from ferry.producer.io.service import Producer

from .helpers import wait_for, welcome_fields

HEARTBEAT_S = 30.0


def test_first_hello_goes_out_when_the_consumer_binds_not_at_the_next_heartbeat():
    folder = tempfile.mkdtemp(prefix="ferry-test-hello-")
    endpoint = f"ipc://{folder}/consumer.sock"
    dataset = SyntheticDataset(length=8, shape=[4], dtype="uint8")
    producer = Producer(ProducerConfig(endpoints=(endpoint,), dataset="synthetic", threads=1, slots=1,
                                       heartbeat=HEARTBEAT_S), dataset)
    conn = next(iter(producer._links)).conn
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    serving = threading.Thread(target=producer.run, name="test-producer")
    started = time.monotonic()
    serving.start()
    try:
        # its first HELLO went nowhere: no consumer yet. It was tried at the loop's first turn, not after a
        # first poll (a quarter heartbeat, 7.5 s here)
        wait_for(lambda: conn.wants_writable, 10, "the producer's first HELLO to find no connection")
        assert time.monotonic() - started < HEARTBEAT_S / 10, "the first HELLO waited for a poll tick"
        router.bind(endpoint)
        bound = time.monotonic()
        assert router.poll(10_000), "no HELLO after the consumer bound (it waits for the next heartbeat?)"
        arrived = time.monotonic() - bound
        peer, hello = router.recv_multipart()
        header = protocol.parse_header(hello)
        assert header["type"] == protocol.HELLO
        # within libzmq's reconnect back-off, far below the heartbeat a tick-driven retry would wait
        assert arrived < HEARTBEAT_S / 10, f"HELLO came {arrived:.2f} s after the bind"
        router.send_multipart([peer, protocol.pack(protocol.WELCOME, session=7, heartbeat=HEARTBEAT_S, **welcome_fields(),
                                                   nonce=header["nonce"])])
        wait_for(lambda: conn.serving, 10, "the producer to take the WELCOME")
        assert not router.poll(300), "a second HELLO: the producer kept saying HELLO on POLLOUT"
    finally:
        producer.stop()
        serving.join(20)
        router.close(0)
        ctx.term()
        try:
            os.rmdir(folder)
        except OSError:
            pass
    assert not serving.is_alive()
