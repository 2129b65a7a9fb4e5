"""The producer's main loop and what only it touches (docs/ARCHITECTURE.md#producer).

* :mod:`.service`: the loop: polls every socket, applies the actions of each connection, sends finished batches;
* :mod:`.linkset`, :mod:`.links`: the consumer connections (DEALER sockets, their monitors), opened as discovery
  decides; :mod:`.resolver`: DNS off the loop;
* :mod:`.outbox`: what leaves (HELLO, PING, BYE, FAIL, batches); :mod:`.buffers`: the pooled batch buffers.
"""
