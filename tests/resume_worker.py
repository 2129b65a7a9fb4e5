"""A training process for the resume test: prints each batch's labels as a JSON line.

    python -m tests.resume_worker ENDPOINT STATE_FILE SAVE_AT   # saves state after batch SAVE_AT, then waits
    python -m tests.resume_worker ENDPOINT STATE_FILE resume    # loads the state and runs to the epoch's end
"""

import json
import sys
import time

import torch

from ferry import RemoteLoader


def main() -> None:
    endpoint, state_file, mode = sys.argv[1:4]
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=21, heartbeat=0.2, timeout=30) as loader:
        if mode == "resume":
            with open(state_file) as f:
                loader.load_state_dict(json.load(f))
            assert torch.load(state_file + ".pt") == loader.state_dict()
        for count, (_, labels, pids) in enumerate(loader, start=1):
            print(json.dumps({"labels": labels.tolist(), "pid": int(pids[0])}), flush=True)
            if mode != "resume" and count == int(mode):
                state = loader.state_dict()
                torch.save(state, state_file + ".pt")
                with open(state_file, "w") as f:
                    json.dump(state, f)
                print("SAVED", flush=True)
                time.sleep(60)  # the test SIGKILLs us here
                sys.exit(1)
    print("END", flush=True)


if __name__ == "__main__":
    main()
