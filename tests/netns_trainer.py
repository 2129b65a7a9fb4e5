"""A training process for namespace tests. Prints one JSON line per batch, runs epochs until told to stop.

    python -m tests.netns_trainer ENDPOINT LENGTH STEP_S [HEARTBEAT [MAX_ATTEMPTS]]
Writes {"epoch", "labels", "pid", "producers", "seen", "reissued", "duplicates"} per batch (``seen``: producers
admitted since the start, so each rejoin counts once more) and {"end": epoch} per
epoch; stops after the epoch in which a line "stop" arrives on stdin (or after 200 epochs).
"""

import json
import sys
import threading
import time

from ferry import RemoteLoader


def main() -> None:
    endpoint, step = sys.argv[1], float(sys.argv[3])  # argv[2], the length, is for the reader
    heartbeat = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
    max_attempts = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.set()
                return

    threading.Thread(target=watch_stdin, daemon=True).start()
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=8, heartbeat=heartbeat, liveness=5,
                      timeout=60, max_attempts=max_attempts) as loader:
        print(json.dumps({"len": len(loader)}), flush=True)
        for epoch in range(200):
            loader.set_epoch(epoch)
            for _, labels, pids in loader:
                s = loader.stats()
                print(json.dumps({"epoch": epoch, "labels": labels.tolist(), "pid": int(pids[0]),
                                  "producers": s["producers"], "seen": s["producers_seen"],
                                  "reissued": s["reissued"],
                                  "duplicates": s["duplicates"]}), flush=True)
                time.sleep(step)
            print(json.dumps({"end": epoch}), flush=True)
            if stop.is_set():
                break


if __name__ == "__main__":
    main()
