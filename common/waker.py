"""A thread-safe wake-up for a zmq poll loop.

ZeroMQ sockets belong to one thread. Other threads wake that thread through the read end of a pipe,
which ``zmq.Poller`` accepts as a raw file descriptor. ``wake()`` is safe from any thread, and from a
``weakref.finalize`` callback.
"""

from __future__ import annotations

import os
import threading


class Waker:
    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        # re-entrant: a signal handler may call wake() on a thread already inside wake() or close()
        self._lock = threading.RLock()
        self._closed = False

    def fileno(self) -> int:
        return self._read_fd

    def wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write_fd, b"\0")
            except BlockingIOError:  # the pipe is full: the reader is already due to wake
                pass

    def drain(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)
