"""Test hosts made of network namespaces joined by veth pairs (root only). Each test makes its own."""

from __future__ import annotations

import os
import subprocess

from .needs import cannot_run  # also imported from here by the tests that make namespaces
from .needs import tool as needs_tool


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Hosts:
    """Two namespaces, ``a`` and ``b``, with a veth link ``10.231.N.1 <-> 10.231.N.2``."""

    def __init__(self, tag: str) -> None:
        n = os.getpid() % 200 + 20
        self.a, self.b = f"ferry-{tag}-a-{os.getpid()}", f"ferry-{tag}-b-{os.getpid()}"
        self.dev_a, self.dev_b = f"fa{n}{tag[:4]}", f"fb{n}{tag[:4]}"
        self.addr_a, self.addr_b = f"10.231.{n}.1", f"10.231.{n}.2"
        self.made: list[str] = []
        try:
            for ns in (self.a, self.b):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", self.dev_a, "type", "veth", "peer", "name", self.dev_b)
            _ip("link", "set", self.dev_a, "netns", self.a)
            _ip("link", "set", self.dev_b, "netns", self.b)
            _ip("-n", self.a, "addr", "add", f"{self.addr_a}/24", "dev", self.dev_a)
            _ip("-n", self.b, "addr", "add", f"{self.addr_b}/24", "dev", self.dev_b)
            self.link(True)
        except BaseException:
            self.close()
            raise

    def link(self, up: bool) -> None:
        """Bring the link up or down (on b's side: b loses its route to a)."""
        state = "up" if up else "down"
        _ip("-n", self.a, "link", "set", self.dev_a, state)
        _ip("-n", self.b, "link", "set", self.dev_b, state)

    def partition(self, cut: bool) -> None:
        """Drop every packet between a and b (iptables in b's own namespace), or heal. Unlike taking the
        veth down, which sometimes makes Linux give up the established TCP connection, a partition keeps
        it, so what was sent during the cut is retransmitted, with back-off, as on a real flaky link: it arrives
        late after a cut shorter than the liveness window; after a longer one both sides have given the
        connection up (common/deadlinks.py)."""
        needs_tool("iptables", "iptables")
        action = "-A" if cut else "-D"
        _ip("netns", "exec", self.b, "iptables", action, "OUTPUT", "-d", self.addr_a, "-j", "DROP")
        _ip("netns", "exec", self.b, "iptables", action, "INPUT", "-s", self.addr_a, "-j", "DROP")

    def close(self) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.made.clear()


def make_hosts(tag: str) -> Hosts:
    if os.geteuid() != 0:
        cannot_run("network namespaces need root")
    try:
        return Hosts(tag)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        cannot_run(f"cannot create network namespaces here: {exc} {detail.decode(errors='replace').strip()}")


class Network:
    """Several namespaces (one per host name) on one bridge, each resolving the others by name.

    Each host gets ``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts over /etc/hosts, so
    ``tcp://trainer:5555`` resolves inside every namespace as it would in a compose network.
    """

    def __init__(self, hosts: list[str], tag: str = "net") -> None:
        pid = os.getpid()
        self.hub = f"ferry-{tag}-{pid}"
        self.ns = {h: f"ferry-{pid}-{h}" for h in hosts}
        self.addr = {h: f"10.232.{pid % 200 + 20}.{i + 10}" for i, h in enumerate(hosts)}
        self.made: list[str] = []
        self.etc: list[str] = []
        try:
            _ip("netns", "add", self.hub)
            self.made.append(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for h, a in self.addr.items())
            for i, (host, ns) in enumerate(self.ns.items()):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                inner, outer = f"fi{pid % 1000}x{i}", f"fo{pid % 1000}x{i}"
                _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "netns", self.hub)
                _ip("-n", self.hub, "link", "set", outer, "master", "br0")
                _ip("-n", self.hub, "link", "set", outer, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr[host]}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                folder = f"/etc/netns/{ns}"
                os.makedirs(folder, exist_ok=True)
                self.etc.append(folder)
                with open(f"{folder}/hosts", "w") as f:
                    f.write(hosts_file)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        import shutil

        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.made.clear()
        for folder in self.etc:
            shutil.rmtree(folder, ignore_errors=True)
        self.etc.clear()


def make_network(hosts: list[str]) -> Network:
    if os.geteuid() != 0:
        cannot_run("network namespaces need root")
    try:
        return Network(hosts)
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        cannot_run(f"cannot create network namespaces here: {exc} {detail.decode(errors='replace').strip()}")


class ShapedLink:
    """One namespace ``ns`` joined to the root namespace by a veth pair, its egress shaped by ``tc tbf``: a
    slow link between a producer in ``ns`` (at ``addr_far``) and a consumer here (at ``addr_here``). With
    ``rate=None`` the pair is not shaped: a link as fast as the machine moves bytes between namespaces."""

    def __init__(self, tag: str, rate: str | None = "200mbit", burst: str = "256kb", latency: str = "50ms") -> None:
        n = os.getpid() % 200 + 20
        self.ns = f"ferry-{tag}-{os.getpid()}"
        self.dev_here, self.dev_far = f"sh{n}{tag[:4]}", f"sf{n}{tag[:4]}"
        self.addr_here, self.addr_far = f"10.233.{n}.1", f"10.233.{n}.2"
        self.made: list[str] = []
        try:
            _ip("netns", "add", self.ns)
            self.made.append("ns")
            _ip("-n", self.ns, "link", "set", "lo", "up")
            _ip("link", "add", self.dev_here, "type", "veth", "peer", "name", self.dev_far)
            self.made.append("veth")
            _ip("link", "set", self.dev_far, "netns", self.ns)
            _ip("addr", "add", f"{self.addr_here}/24", "dev", self.dev_here)
            _ip("link", "set", self.dev_here, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.addr_far}/24", "dev", self.dev_far)
            _ip("-n", self.ns, "link", "set", self.dev_far, "up")
            shaped = ((None, self.dev_here), (self.ns, self.dev_far)) if rate else ()  # both directions
            for where, dev in shaped:
                prefix = ["ip", "netns", "exec", where] if where else []
                subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                                "latency", latency], check=True, capture_output=True, timeout=10)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if "veth" in self.made:  # deleting one end deletes the pair
            subprocess.run(["ip", "link", "del", self.dev_here], capture_output=True, timeout=10)
        if "ns" in self.made:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)
        self.made.clear()


def make_shaped_link(tag: str, rate: str = "200mbit") -> ShapedLink:
    if os.geteuid() != 0:
        cannot_run("a shaped veth link needs root")
    import shutil

    if shutil.which("tc") is None:
        cannot_run("a shaped veth link needs tc (iproute2)")
    try:
        return ShapedLink(tag, rate)
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        cannot_run(f"cannot create a shaped veth link here: {exc} {detail.decode(errors='replace').strip()}")
