"""Staging (docs/ARCHITECTURE.md#staging): from decoded batches to what the training loop uses.

* :mod:`.stagers`: the staging thread's loop, the CPU and CUDA stagers and the pinned buffer pool;
* :mod:`.hostpool`: the receive pool where a leaf that came in several frames is assembled;
* :mod:`.pinning`: host memory registered with CUDA (used slab slots, receive-pool buffers).
"""
