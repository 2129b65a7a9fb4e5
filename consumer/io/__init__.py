"""The io thread (docs/ARCHITECTURE.md#io-thread): the only user of the consumer's socket.

* :mod:`.router`: the ROUTER socket, its context and the CURVE authenticator.
"""
