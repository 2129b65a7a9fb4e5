"""What the producer's main loop hands the :class:`~ferry.producer.loading.batcher.Batcher` (a :class:`Job`, one TASK) and
what it gets back (an :class:`Outcome`, the BATCH or FAIL to send)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.common.constants import DEFAULT_FRAME_BYTES

__all__ = ["Job", "Outcome"]


@dataclass
class Job:
    """One TASK received from one consumer connection."""

    conn_key: int  # which connection it came from
    session: int
    task: int
    epoch: int
    seq: int
    indices: list[int]
    on_error: str
    slot: Any = None  # a ferry.common.shm.SlotWriter: the consumer's shared memory to write this batch into
    seed: int = 0  # the loader's seed: sample_info().seed derives from (seed, epoch, index)
    seed_globals: bool = False  # load each sample under process generators seeded from it (its batcher decides)
    shard: Any = None  # a sharded dataset's task: [k, batch_size, drop_last] of shard indices[0] (producer/loading/shards.py)
    streams: int | None = None  # an iterable dataset's task (with shard): stream indices[0] of this many (streams.py)
    frame_bytes: int = DEFAULT_FRAME_BYTES  # array leaves up to this travel as one frame (the consumer's WELCOME)
    compress: str | None = None  # the codec of this batch's frames (its TASK's; producer/loading/compressing.py), None: raw
    max_batch_bytes: int | None = None  # the consumer's bound (its WELCOME): a larger batch is answered by a FAIL
    # an unbatched loader's task (batch_size=None): "index", the sample dataset[indices[0]]; "list", the sample
    # dataset[indices] (a sampler that yields lists); None: a batch of the samples of indices
    unbatched: str | None = None
    pickle_ok: bool = False  # the consumer's WELCOME allows pickled values (its own local producers only)
    samples: Any = None  # the SamplePool its loads run on, set as it starts (shared by datasets: producer/core/stuck.py)


@dataclass
class Outcome:
    """A message ready for the main loop to send back on ``conn_key``."""

    job: Job
    frames: list[Any] = field(default_factory=list)  # header first, then array frames
    failed: bool = False
    buffer: Any = None  # a pooled batch buffer to give back once ZeroMQ has sent it
    buffer_frames: int = 0  # how many frames after the header are views of `buffer`
    # the zmq.MessageTracker of those frames, when the batch worker made them tracked frames already (off the
    # main loop: producer/io/buffers.py tracked); None: the main loop tracks them as it sends
    tracker: Any = None
