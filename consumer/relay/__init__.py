"""``ferry relay``: a RemoteLoader in a process of its own, handing its batches to one local client of any language.

The relay runs a :class:`~ferry.consumer.loader.RemoteLoader` (local producers, or producers on other hosts: every
option) and serves its batches, in order, to one client over TCP on the loopback interface, with the framing of
docs/relay-protocol.md: a versioned, length-prefixed header naming each array's dtype and dimensions, then the raw
bytes (or, for a client on the same machine that asks for it, a file it reads them from). R's client is
``clients/r``; :mod:`.client` is Python's, the reference the tests use. Design: docs/ARCHITECTURE.md#relay.

Rooms: :mod:`.framing` (the format), :mod:`.leaves` (a batch as parts: dtypes and order for the client),
:mod:`.core` (every decision: credits, held items, reconnects; no sockets, threads or clock) and :mod:`.events` (what
it takes and gives), :mod:`.loading` (the thread that owns the loader's iteration), :mod:`.messages` (an item as its
message), :mod:`.payload` (the payload files), :mod:`.server` (the socket loop that applies the core's actions) and
:mod:`.client`.
"""

from ferry.consumer.relay.server import Relay

__all__ = ["Relay"]
