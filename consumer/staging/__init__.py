"""Staging (docs/ARCHITECTURE.md#staging): from decoded batches to what the training loop uses.

* :mod:`.stagers`: the staging thread's loop, and the choice of stager;
* :mod:`.tensors`: staging on the CPU (tensors over the received memory);
* :mod:`.cuda`: staging to a CUDA device (side stream, pinned pool, events);
* :mod:`.hostpool`: the receive pool where a leaf that came in several frames is assembled;
* :mod:`.pinning`: host memory registered with CUDA (used slab slots, receive-pool buffers).
"""
