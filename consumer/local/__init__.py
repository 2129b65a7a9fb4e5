"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes a loader starts on this machine, owns and stops.

* :mod:`.producers`: :class:`~.producers.LocalProducers`, the set of processes and the thread that watches them;
* :mod:`.children`: one producer process behind one interface (its stderr, its exit);
* :mod:`.folder`: the private temporary folder their socket and captured output live in.
"""
