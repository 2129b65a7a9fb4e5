"""Issue 19, part 3: a producer whose ``--connect`` names a DNS name with several addresses serves every trainer
behind it, and follows the name as it changes, without a restart.

Real processes, real sockets, real name resolution: three loaders bind 127.0.0.2, .3 and .4 on one port; the
producer runs in a mount namespace of its own (``unshare --mount``) where a file of the test's is bind-mounted over
/etc/hosts (with a ``multi on`` host.conf, so that glibc returns every address of a name, and an nsswitch.conf that
looks names up in that file only, never in DNS), as ``ip netns exec`` does with /etc/netns/NAME/hosts. The test rewrites that file in place, and glibc reads it afresh at
each lookup. Root only.
"""

from __future__ import annotations

import os
import shutil

import pytest

from ferry import RemoteLoader

from .helpers import free_port, wait_for
from .needs import cannot_run

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
HOSTS_BYTES = 256  # every version of the hosts file has this size: one pwrite replaces it, never half of it


def write_hosts(path: str, trainers: tuple[str, ...]) -> None:
    """``trainers`` resolves to these addresses, written over the file in place (the bind mount follows its inode)."""
    text = "127.0.0.1 localhost\n" + "".join(f"{address} trainers\n" for address in trainers)
    data = (text + "#" + " " * HOSTS_BYTES)[: HOSTS_BYTES - 1].encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.pwrite(fd, data, 0) == HOSTS_BYTES
    finally:
        os.close(fd)


@pytest.fixture
def private_hosts(tmp_path):
    """(the hosts file, a command prefix that runs a command with that file as its /etc/hosts)."""
    if os.geteuid() != 0:
        cannot_run("a private /etc/hosts needs root (mount --bind in a mount namespace)")
    if shutil.which("unshare") is None:
        cannot_run("a private /etc/hosts needs unshare (util-linux)")
    hosts, conf, nsswitch = str(tmp_path / "hosts"), str(tmp_path / "host.conf"), str(tmp_path / "nsswitch.conf")
    write_hosts(hosts, ())
    with open(conf, "w") as f:
        f.write("multi on\n")
    with open(nsswitch, "w") as f:
        f.write("hosts: files\n")
    mounts = " && ".join(f"mount --bind {mine} {theirs}" for mine, theirs in
                         ((hosts, "/etc/hosts"), (conf, "/etc/host.conf"), (nsswitch, "/etc/nsswitch.conf")))
    prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f'{mounts} && exec "$0" "$@"']
    yield hosts, prefix


def test_a_producer_serves_every_trainer_behind_a_name_and_follows_it_without_a_restart(spawn, private_hosts):
    hosts, prefix = private_hosts
    port = free_port()
    loaders = {address: RemoteLoader(endpoint=f"tcp://{address}:{port}", batch_size=4, heartbeat=0.2, timeout=30,
                                     log_every=None) for address in ADDRESSES}
    try:
        # started before any trainer is behind the name (a Kubernetes Service without ready pods): it waits, warns
        producer = spawn(f"tcp://trainers:{port}", "tests.datasets:PairDataset", {"length": 8}, threads=1,
                         prefix=prefix, extra=["--resolve-interval", "0.3"],
                         env={"FERRY_UNREACHABLE_WARNING_S": "0.5"})
        warning = f"no consumer has answered at tcp://trainers:{port} for "
        wait_for(lambda: warning in producer.output(), 30, "the producer to warn that the name has no address")
        assert "its host 'trainers' does not resolve" in producer.output().split(warning, 1)[1].splitlines()[0]

        def serving() -> dict[str, int]:
            return {address: loader.stats()["producers"] for address, loader in loaders.items()}

        assert serving() == {"127.0.0.2": 0, "127.0.0.3": 0, "127.0.0.4": 0}
        write_hosts(hosts, ADDRESSES[:2])
        wait_for(lambda: serving() == {"127.0.0.2": 1, "127.0.0.3": 1, "127.0.0.4": 0}, 30,
                 f"the producer to serve the two trainers the name has (serving: {serving()})")
        for address in ADDRESSES[:2]:  # each trainer is its own consumer and gets the whole epoch
            assert [y.tolist() for _, y in loaders[address]] == [[0, 1, 2, 3], [4, 5, 6, 7]]

        write_hosts(hosts, ADDRESSES[1:])  # .2 leaves the name, .4 joins it
        wait_for(lambda: serving() == {"127.0.0.2": 0, "127.0.0.3": 1, "127.0.0.4": 1}, 30,
                 f"the producer to follow the name (serving: {serving()}; its log: {producer.output()[-2000:]})")
        assert [y.tolist() for _, y in loaders["127.0.0.4"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert loaders["127.0.0.3"].stats()["producers_seen"] == 1  # the address that stayed kept its connection
        assert producer.proc.poll() is None  # the same process throughout
        output = producer.output()
        assert "'trainers' resolves to 127.0.0.3, 127.0.0.4 (2 consumer connections; joining 127.0.0.4; " \
               "leaving 127.0.0.2)" in output, output
        assert f"closing the connection to tcp://127.0.0.2:{port} (trainers)" in output, output
        assert producer.terminate() == 0
    finally:
        for loader in loaders.values():
            loader.close()


def test_two_addresses_of_one_consumer_are_two_steady_producers_to_it(spawn, private_hosts):
    """A multi-homed host or a load balancer: the name has two addresses, one consumer answers on both. Each
    connection says HELLO with an id of its own, so the consumer keeps both instead of taking each HELLO of one
    for the other restarting its work (which would drop and re-issue its tasks at every heartbeat)."""
    hosts, prefix = private_hosts
    port = free_port()
    write_hosts(hosts, ADDRESSES[:2])
    with RemoteLoader(endpoint=f"tcp://*:{port}", batch_size=4, heartbeat=0.2, timeout=30, log_every=None) as loader:
        producer = spawn(f"tcp://trainers:{port}", "tests.datasets:PairDataset", {"length": 64}, threads=1,
                         prefix=prefix, extra=["--resolve-interval", "0.3"])
        wait_for(lambda: loader.stats()["producers"] == 2, 30, "both connections to be admitted")
        for epoch in range(3):  # some seconds of heartbeats, HELLOs and re-resolutions
            loader.set_epoch(epoch)
            assert sorted(int(i) for _, y in loader for i in y) == list(range(64))
        stats = loader.stats()
        assert stats["producers"] == 2 and stats["producers_seen"] == 2 and stats["reissued"] == 0, stats
        assert producer.proc.poll() is None
