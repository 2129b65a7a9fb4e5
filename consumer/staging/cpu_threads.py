"""One CPU thread for torch's operations on the calling thread, and on no other thread.

The staging thread's copies (``pin_memory``, copies into pinned buffers) would otherwise run on a second
OpenMP team as large as the training thread's, on the same cores. ``torch.set_num_threads(1)`` sets the
calling thread's team size, but also the size every thread started later begins with (torch keeps it in one
process-wide value): after a loader, the trainer's own new threads and autograd's device threads would run
their CPU operations on one thread. So that value is put back, from a short-lived thread of its own
(STYLE.md, rule 12). A thread that makes its first torch call in the microseconds between the two starts
with one thread.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["use_one_cpu_thread"]

#: Bound on the wait for the restoring thread (one call that takes microseconds). [Unit: second]
RESTORE_TIMEOUT_S = 5.0
_lock = threading.Lock()  # two loaders' staging threads starting at once: each reads the value the other put back


def use_one_cpu_thread() -> None:
    """Make torch run this thread's CPU operations on one thread; leave what other threads start with."""
    with _lock:
        inherited = torch.get_num_threads()  # this thread is new: this is what every new thread starts with
        torch.set_num_threads(1)
        if inherited == 1:
            return
        restore = threading.Thread(target=torch.set_num_threads, args=(inherited,), name="ferry-threads-restore",
                                   daemon=True)
        restore.start()
        restore.join(RESTORE_TIMEOUT_S)
