"""An object that crosses to a ``spawn`` or ``forkserver`` process pickled, and is unpickled there only when
the receiver asks (:meth:`DeferredPickle.load`).

The consumer's local mode hands a producer its dataset this way: ``multiprocessing`` unpickles a process's
arguments before its target runs, so an error in the dataset's unpickling (a file that cannot be reopened, a
class the child cannot import) would otherwise happen before :func:`ferry.producer.serve` has made its stderr
the pipe its loader reads, and be missing from the producer's death report. Deferred, it is raised inside
``serve``. A forked child gets the object itself: nothing is pickled.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["DeferredPickle", "WithHooks", "HOOKS"]

#: The producer's hooks that travel pickled with its dataset (ProducerConfig's fields of these names).
HOOKS = ("init", "collate", "transform")

_NOTHING = object()


class DeferredPickle:
    """Holds ``obj``; pickles it (with ``multiprocessing``'s pickler, as a process's arguments are) into bytes
    that are unpickled only by :meth:`load` on the receiving side."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj
        self._data = b""

    @classmethod
    def _from_bytes(cls, data: bytes) -> "DeferredPickle":
        deferred = cls(_NOTHING)
        deferred._data = data
        return deferred

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # pickled within the process's own pickling (Process.start), so reducers that need the child being
        # spawned (file descriptors, torch's shared tensors) see it, as for any argument
        data = self._data if self._obj is _NOTHING else bytes(ForkingPickler.dumps(self._obj))
        return DeferredPickle._from_bytes, (data,)

    def load(self) -> Any:
        """The object: the one given here, or the one unpickled from the bytes that arrived.

        Raises:
            Exception: whatever unpickling the object raises (its ``__setstate__``, a missing class)."""
        if self._obj is _NOTHING:
            self._obj = ForkingPickler.loads(self._data)
            self._data = b""
        return self._obj


class WithHooks:
    """A dataset and the hooks that go with it (``init``, ``collate``, ``transform``), pickled together: a hook
    that is a bound method of the dataset (``producer_init=ds.init_worker``) then runs on the very copy the
    producer serves, as DataLoader's ``worker_init_fn`` does; pickled apart, it ran on a copy of its own."""

    def __init__(self, dataset: Any, **hooks: Any) -> None:
        self.dataset, self.hooks = dataset, hooks
