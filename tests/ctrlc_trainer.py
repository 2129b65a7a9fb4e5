"""A training script that the user stops with Ctrl-C (SIGINT): ``python -m tests.ctrlc_trainer ENDPOINT``.

``with RemoteLoader(endpoint=ENDPOINT) as loader:`` (heartbeat 10 s, liveness 2: a producer that misses the BYE
calls the consumer silent only after 20 s, and no PING crosses the wire meanwhile); prints "READY" after its
fourth batch, then runs a long step (at most 60 s), which the signal interrupts.
"""

import sys
import time

from ferry import RemoteLoader


def main() -> None:
    deadline = time.monotonic() + 60
    with RemoteLoader(endpoint=sys.argv[1], batch_size=4, heartbeat=10.0, liveness=2, log_every=None) as loader:
        for taken, _ in enumerate(loader, 1):
            if taken == 4:
                print("READY", flush=True)
                while time.monotonic() < deadline:  # the step
                    time.sleep(0.05)
                return


if __name__ == "__main__":
    main()
