"""Test hosts made of network namespaces joined by veth pairs (root only). Each test makes its own."""

from __future__ import annotations

import os
import subprocess

import pytest


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

    def close(self) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.made.clear()


def make_hosts(tag: str) -> Hosts:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    try:
        return Hosts(tag)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot create network namespaces here: {exc} {detail.decode(errors='replace').strip()}")
