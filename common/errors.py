"""Ferry's error types: a small, flat hierarchy with context.

Every error names what it is about: the endpoint, the peer (host:pid), the sample index or the file.
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "ConfigError",
    "DatasetSpecError",
    "DatasetOpenError",
    "DatasetError",
    "SampleLoadError",
    "MissingExtraError",
    "ProtocolError",
    "VersionMismatch",
    "RelayError",
    "NoProducersError",
    "BatchTimeoutError",
    "RemoteSampleError",
    "ProducerStartupError",
    "FerryThreadError",
    "LoaderClosedError",
    "ProducerDiedError",
]


class FerryError(Exception):
    """Base class of every error Ferry raises on purpose."""


class ConfigError(FerryError, ValueError):
    """An option or a combination of options is invalid."""


class DatasetSpecError(FerryError, ValueError):
    """A dataset spec cannot be resolved into a dataset."""


class DatasetOpenError(DatasetSpecError):
    """A producer's dataset failed to open at its start: the dataset's constructor, its length or fingerprint, the
    transform, the collate class or the init hook raised (not the spec itself, nor a bad argument: those stay
    DatasetSpecError or ConfigError). The command line exits 4 for it (producer/exits.py); the cause is chained."""


class DatasetError(FerryError, ValueError):
    """A dataset's files or samples break its format (a packed index, a record of the wrong size)."""


class SampleLoadError(FerryError):
    """A built-in dataset could not load one sample; the message names the file."""


class MissingExtraError(FerryError, ImportError):
    """An optional dependency of a dataset format is not installed; the message says which extra to install."""


class ProtocolError(FerryError):
    """A message is malformed, or was not expected. Carries the reason; never crashes a thread."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version."""

    def __init__(self, theirs: object, ours: int, msg_type: object) -> None:
        self.theirs, self.ours, self.msg_type = theirs, ours, msg_type
        super().__init__(f"protocol version {theirs!r} is not supported (this side speaks {ours})")


class RelayError(FerryError):
    """A relay (``ferry relay``) refused its client (another protocol version, a wrong token, busy with another
    client), the connection to it broke, or it sent what the protocol does not allow. The message says which."""


class NoProducersError(FerryError, TimeoutError):
    """No producer has been alive for ``no_producer_timeout`` seconds (or producers kept joining and leaving
    without delivering for that long)."""


class BatchTimeoutError(FerryError, RuntimeError):
    """A batch did not come within ``timeout`` seconds of asking for it: DataLoader's ``timeout``, whose
    "DataLoader timed out after N seconds" is a RuntimeError too. The batch is not lost: the next call waits
    for it again."""


class ProducerStartupError(FerryError, RuntimeError):
    """A local producer process died before it could serve."""


class FerryThreadError(FerryError, RuntimeError):
    """One of the loader's own threads (io or staging) failed; the original exception is the cause."""


class LoaderClosedError(FerryError, RuntimeError):
    """The RemoteLoader was used after ``close()``."""


class RemoteSampleError(FerryError):
    """A sample raised an exception on a producer (in ``__getitem__``, a transform or ``collate_fn``).

    Attributes name the sample ``index``, the ``producer`` (host:pid), the remote exception type and
    message, and the remote traceback text; ``exc_classes`` the remote exception's class and its bases
    (``module:qualname``), when the producer named them. Where one of those classes can be rebuilt here, the
    error raised is of a class made from it and this one, so ``except KeyError`` catches it too (see
    :mod:`ferry.common.remote_errors`).
    """

    def __init__(
        self,
        *,
        index: int,
        producer: str,
        exc_type: str,
        message: str,
        traceback: str,
        epoch: int | None = None,
        seq: int | None = None,
        exc_classes: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.index = index
        self.producer = producer
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = traceback
        self.epoch = epoch
        self.seq = seq
        self.exc_classes = tuple(exc_classes)
        where = f" (epoch {epoch}, batch {seq})" if epoch is not None else ""
        self._ferry_text = (f"sample {index} failed on producer {producer}{where}: {exc_type}: {message}\n"
                            f"--- remote traceback ---\n{traceback.rstrip()}")
        super().__init__(self._ferry_text)

    def fields(self) -> dict:
        """The keywords that build this error again."""
        return {"index": self.index, "producer": self.producer, "exc_type": self.exc_type, "message": self.message,
                "traceback": self.remote_traceback, "epoch": self.epoch, "seq": self.seq,
                "exc_classes": self.exc_classes}

    def __reduce__(self):  # keep it picklable across processes
        return (
            _rebuild_remote_sample_error,
            (self.index, self.producer, self.exc_type, self.message, self.remote_traceback, self.epoch, self.seq,
             self.exc_classes),
        )


def _rebuild_remote_sample_error(index, producer, exc_type, message, traceback, epoch, seq, exc_classes=()):
    return RemoteSampleError(
        index=index, producer=producer, exc_type=exc_type, message=message, traceback=traceback, epoch=epoch, seq=seq,
        exc_classes=exc_classes,
    )


class ConfigTypeError(ConfigError, TypeError):
    """An option has the wrong type (``batch_size="8"``, ``seed=None``): a ConfigError that is also a TypeError."""


__all__.append("ConfigTypeError")


class ProducerDiedError(FerryError, RuntimeError):
    """Every local producer process has died after serving (killed, or crashed mid-run).

    The message names each one's pid, its exit code or signal, and the tail of its error output.
    """


class ProducerExitError(FerryError, RuntimeError):
    """A producer stopped serving with a failure that a restart would repeat: exit status 2 (its configuration) or 3
    (every consumer rejected it permanently), where an engine restarts failed producers (``ferry.ray`` raises it
    from an actor's ``serve()`` and ends that actor for good). ``status`` is the exit status
    (:mod:`ferry.producer.exits`); the message says why."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, status)  # both in args: it pickles (Ray sends it to the caller)
        self.status = status

    def __str__(self) -> str:
        return f"{self.args[0]} (exit status {self.status})"


__all__.append("ProducerExitError")


class SampleIndexError(FerryError, IndexError):
    """A planned sample index lies outside the dataset (a user sampler's ``99`` for 20 samples).

    Raised in the training loop at that batch's position, at once: the task is never re-issued.
    Attributes: ``index``, ``length`` (the dataset's), and the ``epoch`` and ``seq`` of the batch.
    """

    def __init__(self, *, index: int, length: int, epoch: int | None = None, seq: int | None = None) -> None:
        self.index, self.length, self.epoch, self.seq = index, length, epoch, seq
        where = f" (epoch {epoch}, batch {seq})" if epoch is not None else ""
        super().__init__(f"sample index {index} is out of range for a dataset of {length} samples{where}")

    def __reduce__(self):
        return (_rebuild_sample_index_error, (self.index, self.length, self.epoch, self.seq))


def _rebuild_sample_index_error(index, length, epoch, seq):
    return SampleIndexError(index=index, length=length, epoch=epoch, seq=seq)


class BatchTooLarge(FerryError, ValueError):
    """A producer's batch is larger than the consumer's ``max_batch_bytes`` (which the consumer announces in
    WELCOME), so it was never sent: the producer answers the task with this error instead.

    Raised in the training loop at that batch's position, whatever ``on_error`` says, and never re-issued: every
    producer would build the same batch. Raise ``max_batch_bytes`` or lower ``batch_size``. The message names
    both sizes and, on the consumer, the producer and the batch.
    """


class PoisonTaskError(FerryError, RuntimeError):
    """A batch's task was lost ``max_attempts`` times (its producer died, it timed out, or its answer was
    unusable): it is not issued again.

    Attributes: ``epoch``, ``seq``, ``indices`` (the batch's samples), and ``attempts``: one
    ``(producer, cause)`` pair per failed attempt, oldest first.
    """

    def __init__(self, *, epoch: int, seq: int, indices: list[int], attempts: list[tuple[str, str]]) -> None:
        self.epoch, self.seq, self.indices = epoch, seq, list(indices)
        self.attempts = [tuple(a) for a in attempts]
        shown = self.indices if len(self.indices) <= 16 else [*self.indices[:16], "..."]
        lines = "".join(f"\n  attempt {n}: producer {producer}: {cause}"
                        for n, (producer, cause) in enumerate(self.attempts, 1))
        super().__init__(f"batch {seq} of epoch {epoch} (samples {', '.join(map(str, shown))}) was lost on "
                         f"{len(self.attempts)} attempts; it is not issued again (max_attempts):{lines}")

    def __reduce__(self):
        return (_rebuild_poison_task_error, (self.epoch, self.seq, self.indices, self.attempts))


def _rebuild_poison_task_error(epoch, seq, indices, attempts):
    return PoisonTaskError(epoch=epoch, seq=seq, indices=indices, attempts=attempts)


class BatchTypeError(FerryError, TypeError):
    """A batch holds a value of a class that cannot travel, or cannot be rebuilt where it arrives: a class of your
    own over the network unregistered (nothing is pickled there), or a registered type that the training process
    has not registered. The message names the class and ``ferry.register_batch_type``.

    Raised in the training loop at that batch's position, whatever ``on_error`` says, and never re-issued: every
    producer would build the same batch.
    """


class CollateError(FerryError, TypeError, RuntimeError):
    """The samples of a batch cannot be collated; the message says where in the sample and why. A TypeError,
    as ``default_collate``'s for a type it cannot batch, and a RuntimeError, as its "each element in list of
    batch should be of equal size"."""


__all__ += ["SampleIndexError", "PoisonTaskError", "BatchTooLarge", "BatchTypeError", "CollateError"]
