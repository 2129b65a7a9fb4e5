"""Keep freed memory in the process: glibc's mmap and trim thresholds, set once, by explicit choice.

Both sides allocate and free the same large blocks for every batch: a producer a user dataset's ``np.load``
result per sample and collation's batch; a consumer libzmq's buffer for every received frame. By default
glibc unmaps blocks above its mmap threshold on free and trims its heaps, so every batch pays a page fault
and a zeroed page per 4 KiB of fresh memory. Raising the two thresholds keeps those blocks for reuse.
Measured on the consumer (tcp loopback, 1 and 4 MiB batches): tens of thousands of minor faults per GB
received before, about a thousand after (docs/tuning.md#frame-size).

Who calls it: a producer, in its own process (``ferry.producer.serve``); a trainer only when its script calls
``ferry.keep_freed_memory()``. A loader never does: these settings are process-wide and outlive it, so they
are the user's choice, not a loader's (STYLE.md, rule 12).
"""

from __future__ import annotations

import ctypes
import logging
import os

from ferry.common.errors import ConfigError

__all__ = ["keep_freed_memory", "wanted_by_environment", "KEEP_FREED_BYTES", "HEAP_BLOCK_BYTES", "ENV_VAR"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Freed heap memory up to this much stays in the process instead of going back to the kernel. [Unit: byte]
KEEP_FREED_BYTES = 1 << 30
#: Blocks up to this size come from the heap, so they are reused after a free, not mapped afresh each time.
#: glibc's own ceiling for this setting on 64-bit (HEAP_MAX / 2). [Unit: byte]
HEAP_BLOCK_BYTES = 32 << 20
#: ``0`` keeps glibc's defaults in a process that would otherwise keep freed memory; ``1`` (or unset) does not.
ENV_VAR = "FERRY_KEEP_FREED_MEMORY"

_applied: list[bool] = []


def wanted_by_environment() -> bool:
    """False where the environment says ``FERRY_KEEP_FREED_MEMORY=0``, else True. Reads only; changes nothing.

    Raises:
        ConfigError: ``FERRY_KEEP_FREED_MEMORY`` is set to something other than 0 or 1."""
    wanted = os.environ.get(ENV_VAR, "").strip() or "1"  # empty: unset, as for every FERRY_*
    if wanted not in ("0", "1"):  # a typo must not silently pick one of two process-wide behaviours
        raise ConfigError(f"{ENV_VAR} must be 0 (glibc's defaults) or 1 (keep freed memory, the "
                          f"default), got {wanted!r}")
    return wanted == "1"


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold to HEAP_BLOCK_BYTES (32 MiB) and its trim threshold to KEEP_FREED_BYTES
    (1 GiB) for the whole process, once: freed blocks up to 32 MiB are reused instead of unmapped, and up to
    1 GiB of freed heap memory stays in the process. For everything the process allocates, for its lifetime:
    there is no undo. Call it early in a training script that receives batches over a socket
    (docs/tuning.md#frame-size); producers call it themselves.

    Returns:
        True if applied (now or before); False where the C library is not glibc or refused, or where the
        environment says ``FERRY_KEEP_FREED_MEMORY=0`` (then nothing changes).

    Raises:
        ConfigError: ``FERRY_KEEP_FREED_MEMORY`` is set to something other than 0 or 1."""
    if _applied:
        return _applied[0]
    if not wanted_by_environment():
        _applied.append(False)  # the user keeps glibc's defaults for this process (docs/tuning.md#frame-size)
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _applied.append(False)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
    if not ok:
        logging.getLogger("ferry").debug("mallopt refused Ferry's memory settings")
    _applied.append(ok)
    return ok
