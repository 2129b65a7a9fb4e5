"""The producer's decisions, with no sockets, threads or clock (docs/ARCHITECTURE.md#producer).

* :mod:`.connection`: one consumer connection's protocol as a state machine (events in, :mod:`.actions` out);
* :mod:`.discovery`: which connections the endpoints call for;
* :mod:`.fairshare`, :mod:`.sharing`: which dataset each connection serves and whose task starts next;
* :mod:`.stuck`: given-up loads that hold the producer's HELLOs;
* :mod:`.jobs`: a TASK as the loop hands it to the loading threads, and what comes back.
"""
