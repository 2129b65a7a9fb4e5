"""The relay's loader thread (``ferry-relay-loader``): the one thread that iterates the loader.

It runs the core's commands one at a time, in order (start a pass, pull its next item, set the epoch, load a
state), and posts each answer back to the socket loop, which feeds it to the core. A pull blocks as long as the
loader waits for its batch: it is the only thing that waits on the loader, so the socket loop never does. Stopped
by :meth:`LoaderThread.stop`: a sentinel command, after the loader was closed (its wait then ends with
``LoaderClosedError``); joined with a bound.
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import Any, Callable

from ferry.common.constants import JOIN_TIMEOUT_S
from ferry.consumer.relay.events import (
    Done, ErrorReport, Item, LoadState, PassStarted, PullItem, Pulled, SetEpoch, StartPass,
)

__all__ = ["LoaderThread", "report"]

_STOP = object()


def report(exc: BaseException, consumed: bool = False) -> ErrorReport:
    """An exception as it crosses to the client: its class names (most derived first, up to Exception) and its
    message, and the traceback of where it was raised (a remote sample's own traceback is in its message)."""
    names: list[str] = []
    for cls in type(exc).__mro__:
        if cls in (object, BaseException):
            continue
        if cls.__name__ not in names:
            names.append(cls.__name__)
    return ErrorReport(type(exc).__name__, tuple(names), str(exc),
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), consumed)


class LoaderThread:
    """Runs the loader's commands on a thread of its own; ``post(answer)`` is called with each answer."""

    def __init__(self, loader: Any, post: Callable[[Any], None]) -> None:
        self._loader = loader
        self._post = post
        self._commands: "queue.Queue[Any]" = queue.Queue()
        self._iterator: Any = None
        self._pass = 0
        self.thread = threading.Thread(target=self._run, name="ferry-relay-loader", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, command: Any) -> None:
        self._commands.put(command)

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Ask the thread to end after its command and join it (the loader must be closed first if a pull waits)."""
        self._commands.put(_STOP)
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            command = self._commands.get()
            if command is _STOP:
                return
            self._post(self._run_one(command))

    def _run_one(self, command: Any) -> Any:
        loader = self._loader
        if isinstance(command, StartPass):
            try:
                self._iterator, self._pass = iter(loader), command.pass_no
                try:
                    length = len(self._iterator)
                except TypeError:
                    length = -1  # discovered while reading: a sharded or iterable dataset without lengths
                it = self._iterator
                return PassStarted(command.pass_no, it.epoch, it.first_seq, length, loader.state_dict())
            except Exception as exc:
                self._iterator = None
                return PassStarted(command.pass_no, 0, 0, -1, {}, report(exc))
        if isinstance(command, PullItem):
            return Pulled(self._pull(command))
        try:
            if isinstance(command, SetEpoch):
                loader.set_epoch(command.epoch)
                return Done("set_epoch", loader.state_dict())
            if isinstance(command, LoadState):
                loader.load_state_dict(command.state)
                return Done("load_state", loader.state_dict())
        except Exception as exc:
            return Done(type(command).__name__, None, report(exc))
        raise AssertionError(f"unknown command {command!r}")

    def _pull(self, command: PullItem) -> Item:
        it = self._iterator
        if it is None or command.pass_no != self._pass:
            return Item(command.pass_no, command.number, "end", 0, -1, self._loader.state_dict())
        before = it.yielded
        try:
            tree = next(it)
        except StopIteration:
            return Item(command.pass_no, command.number, "end", it.epoch, -1, self._loader.state_dict())
        except Exception as exc:
            consumed = it.yielded > before  # a sample's error takes its batch's place; a wait's does not
            index = it.first_seq + it.yielded - 1 if consumed else -1
            return Item(command.pass_no, command.number, "error", it.epoch, index, self._loader.state_dict(),
                        error=report(exc, consumed))
        return Item(command.pass_no, command.number, "batch", it.epoch, it.first_seq + it.yielded - 1,
                    self._loader.state_dict(), tree=tree)
