"""The consumer's protocol logic, with no threads, sockets or clock (docs/ARCHITECTURE.md#consumer-core).

:class:`ConsumerCore` takes events (a message from a peer, a heartbeat tick with the current time, the
training loop's commands, a local producer's death) and returns actions (send this frame to that peer, hand
this batch on, log this line). The io thread (:mod:`ferry.consumer.io.thread`) polls the socket and applies
them. The parts:

* :mod:`.consumer`: the state machine itself, :class:`ConsumerCore`;
* :mod:`.admission`: who may feed this consumer (HELLO, the dataset checks, liveness);
* :mod:`.dispatcher`: credits, tasks in flight, attempts and poison, re-issue;
* :mod:`.sequencers`, :mod:`.shards`: a run's order and reorder buffer, one strategy per kind of plan;
* :mod:`.answers`: what a BATCH or FAIL does (claimed, checked, put in its place), with the checks of
  :mod:`.results`;
* :mod:`.issuing`: what a TASK says;
* :mod:`.compression`: the codec each TASK names, and under ``"auto"`` the consumer's choice;
* :mod:`.slots`: which task holds which shared-memory slot;
* :mod:`.compression`: which codec the remote links use under ``compression="auto"``;
* :mod:`.delivery`, :mod:`.actions`: what leaves the core.

No module here imports ``zmq``, ``threading``, ``socket`` or ``time`` (tests/test_core_purity.py).
"""

from ferry.consumer.core.actions import Action, Deliver, Log, Send
from ferry.consumer.core.consumer import ConsumerCore, CoreConfig
from ferry.consumer.core.delivery import Delivery, EndOfRun, is_eof
from ferry.consumer.core.sequencers import Sequencer, sequencer_for

__all__ = ["ConsumerCore", "CoreConfig", "Action", "Deliver", "Log", "Send", "Delivery", "EndOfRun", "is_eof",
           "Sequencer", "sequencer_for"]
