"""Keep freed memory in the process: glibc's mmap and trim thresholds, set once (producer and consumer).

Both sides allocate and free the same large blocks for every batch: a producer a user dataset's ``np.load``
result per sample and collation's batch; a consumer libzmq's buffer for every received frame. By default
glibc unmaps blocks above its mmap threshold on free and trims its heaps, so every batch pays a page fault
and a zeroed page per 4 KiB of fresh memory. Raising the two thresholds keeps those blocks for reuse.
Measured on the consumer (tcp loopback, 1 and 4 MiB batches): 24-60k minor faults per GB received before,
under 1.5k after (docs/tuning.md#frame-size).
"""

from __future__ import annotations

import ctypes
import logging
import os

from ferry.common.errors import ConfigError

__all__ = ["keep_freed_memory", "KEEP_FREED_BYTES", "HEAP_BLOCK_BYTES"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Freed heap memory up to this much stays in the process instead of going back to the kernel. [Unit: byte]
KEEP_FREED_BYTES = 1 << 30
#: Blocks up to this size come from the heap, so they are reused after a free, not mapped afresh each time.
#: glibc's own ceiling for this setting on 64-bit (HEAP_MAX / 2). [Unit: byte]
HEAP_BLOCK_BYTES = 32 << 20

_applied: list[bool] = []


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold to HEAP_BLOCK_BYTES and its trim threshold to KEEP_FREED_BYTES, once per
    process. True if applied (now or before); False where the C library is not glibc or refused, or where
    the environment says ``FERRY_KEEP_FREED_MEMORY=0`` (these are process-wide settings: in a trainer they
    apply to everything it allocates).

    Raises:
        ConfigError: ``FERRY_KEEP_FREED_MEMORY`` is set to something other than 0 or 1."""
    if _applied:
        return _applied[0]
    wanted = os.environ.get("FERRY_KEEP_FREED_MEMORY", "").strip() or "1"  # empty: unset, as for every FERRY_*
    if wanted not in ("0", "1"):  # a typo must not silently pick one of two process-wide behaviours
        raise ConfigError(f"FERRY_KEEP_FREED_MEMORY must be 0 (glibc's defaults) or 1 (keep freed memory, the "
                          f"default), got {wanted!r}")
    if wanted == "0":
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
