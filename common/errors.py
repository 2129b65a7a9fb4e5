"""Ferry's error types: a small, flat hierarchy with context.

Every error names what it is about: the endpoint, the peer (host:pid), the sample index or the file.
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "ConfigError",
    "DatasetSpecError",
    "DatasetError",
    "SampleLoadError",
    "MissingExtraError",
    "ProtocolError",
    "VersionMismatch",
    "NoProducersError",
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


class NoProducersError(FerryError, TimeoutError):
    """No producer has been alive for ``timeout`` seconds."""


class ProducerStartupError(FerryError, RuntimeError):
    """A local producer process died before it could serve."""


class FerryThreadError(FerryError, RuntimeError):
    """One of the loader's own threads (io or staging) failed; the original exception is the cause."""


class LoaderClosedError(FerryError, RuntimeError):
    """The RemoteLoader was used after ``close()``."""


class RemoteSampleError(FerryError):
    """A sample raised an exception on a producer.

    Attributes name the sample ``index``, the ``producer`` (host:pid), the remote exception type and
    message, and the remote traceback text.
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
    ) -> None:
        self.index = index
        self.producer = producer
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = traceback
        self.epoch = epoch
        self.seq = seq
        where = f" (epoch {epoch}, batch {seq})" if epoch is not None else ""
        super().__init__(
            f"sample {index} failed on producer {producer}{where}: {exc_type}: {message}\n"
            f"--- remote traceback ---\n{traceback.rstrip()}"
        )

    def __reduce__(self):  # keep it picklable across processes
        return (
            _rebuild_remote_sample_error,
            (self.index, self.producer, self.exc_type, self.message, self.remote_traceback, self.epoch, self.seq),
        )


def _rebuild_remote_sample_error(index, producer, exc_type, message, traceback, epoch, seq):
    return RemoteSampleError(
        index=index, producer=producer, exc_type=exc_type, message=message, traceback=traceback, epoch=epoch, seq=seq
    )


class ConfigTypeError(ConfigError, TypeError):
    """An option has the wrong type (``batch_size="8"``, ``seed=None``): a ConfigError that is also a TypeError."""


__all__.append("ConfigTypeError")


class ProducerDiedError(FerryError, RuntimeError):
    """Every local producer process has died after serving (killed, or crashed mid-run).

    The message names each one's pid, its exit code or signal, and the tail of its error output.
    """
