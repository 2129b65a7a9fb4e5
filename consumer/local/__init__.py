"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes a loader starts on this machine, owns and stops.

* :mod:`.producers`: :class:`~.producers.LocalProducers`, the set of processes (``scale_to``, ``check``, ``close``);
* :mod:`.watch`: the ``ferry-local-watch`` thread, which starts, watches, replaces and stops them;
* :mod:`.members`: which process holds each place and what is planned for each, under one lock;
* :mod:`.autoscale`: ``local_producers="auto"``, the policy and the autoscaler the training thread calls;
* :mod:`.children`: one producer process behind one interface (its stderr, its exit);
* :mod:`.folder`: the private temporary folder their socket and captured output live in.
"""
