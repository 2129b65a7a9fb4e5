"""One local producer process as the watch thread sees it (docs/ARCHITECTURE.md#local-mode).

:class:`Child` puts one interface over a ``subprocess.Popen`` (a dataset spec) and a ``multiprocessing``
process (a dataset object): its stderr pipe and the ``producer-N.stderr`` file that captures it, the
sentinel that becomes readable when it exits (``Process.sentinel``, or a ``pidfd``), stopping it, and the
report of its death with the tail of its error output. :class:`ferry.consumer.local.LocalProducers` starts
the children (a subprocess with ``stderr=PIPE``; a ``multiprocessing`` process with a FIFO it opens as its own
fd 2) and owns the thread that watches them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

#: Who else stops a local producer: the loader itself never does without first letting it go.
OUTSIDE_STOP = "a kill, a supervisor, or a signal to the trainer's whole process group"

#: The tail of a dead producer's error output that its report quotes.
STDERR_TAIL_LINES = 15
STDERR_TAIL_CHARS = 2000


def describe_exit(code: int) -> str:
    """``exit code 1``, or ``killed by SIGKILL`` for a negative (signal) code; a producer's exit for stuck loads
    (producer/core/stuck.py) says so."""
    from ferry.producer.exits import EXIT_STUCK

    if code == EXIT_STUCK:
        return f"exit code {code} (loads its consumers gave up on held all its loading threads)"
    if code == 0:  # its SIGTERM handler's exit: the loader asks with SIGTERM only when it stops it itself
        return f"exit code 0 (stopped by a SIGTERM from outside this loader: {OUTSIDE_STOP})"
    if code >= 0:
        return f"exit code {code}"
    if -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return f"killed by {signal.Signals(-code).name} from outside this loader ({OUTSIDE_STOP})"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class Child:
    """One producer process, behind one interface whatever started it, with its stderr pipe and capture."""

    def __init__(self, index: int, handle: Any, stderr_fd: int, sentinel: int | None, own_sentinel: bool,
                 capture: Any, generation: int = 0) -> None:
        self.index = index
        self.generation = generation  # 0: the first start of producer `index`; n: its n-th replacement
        self.handle = handle
        self.stderr_fd = stderr_fd  # the read end of its stderr pipe (or FIFO), non-blocking
        self.sentinel = sentinel  # readable once it has exited; None: poll its exit code
        self._own_sentinel = own_sentinel  # a pidfd of ours (a Process's sentinel belongs to the Process)
        self.capture = capture  # producer-N.stderr, unbuffered
        self.exit_code: int | None = None  # set by the watch thread when it sees the death

    @property
    def pid(self) -> int:
        return self.handle.pid

    def exitcode(self) -> int | None:
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        return self.handle.exitcode

    def signal_stop(self) -> None:
        if self.exitcode() is None:
            self.handle.terminate()

    def kill(self) -> None:
        if self.exitcode() is None:
            self.handle.kill()

    def stop(self, timeout: float) -> None:
        """SIGTERM (it says BYE and exits 0), then SIGKILL after ``timeout`` seconds; reaped either way."""
        self.signal_stop()
        if not self.wait(timeout):
            self.kill()
            self.wait(timeout)

    def wait(self, timeout: float) -> bool:
        if isinstance(self.handle, subprocess.Popen):
            try:
                self.handle.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        self.handle.join(timeout)
        return self.handle.exitcode is not None

    def pump(self) -> bool:
        """Copy what the producer wrote to stderr to our stderr and to its capture file. False at EOF."""
        while True:
            try:
                chunk = os.read(self.stderr_fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self.capture.write(chunk)
            _echo(chunk)

    def _captured_tail(self) -> str:
        """The last lines it wrote to stderr, as written ("" for none)."""
        try:
            fd = self.capture.fileno()
            size = os.fstat(fd).st_size
            start = max(0, size - 4 * STDERR_TAIL_CHARS)
            text = os.pread(fd, size - start, start).decode(errors="replace")
        except (OSError, ValueError):
            text = ""
        return "\n".join(text.rstrip().splitlines()[-STDERR_TAIL_LINES:])[-STDERR_TAIL_CHARS:]

    def tail(self) -> str:
        """The last lines it wrote to stderr, indented, or a note that there were none."""
        text = self._captured_tail()
        if not text and self.stopped_from_outside():
            return "    (nothing: it did not fail, it was stopped)"
        if not text:
            return ("    (it wrote nothing to stderr once started; what it wrote while starting went to this\n"
                    "    process's stderr, above: under spawn or forkserver, a script without\n"
                    "    `if __name__ == \"__main__\":` builds its loader again in each producer, which Python refuses)")
        return "\n".join("    " + line for line in text.splitlines())

    def stopped_from_outside(self) -> bool:
        """It exited as a producer does when asked to stop (0, or killed by SIGTERM, SIGINT or SIGHUP), and the
        loader did not ask it (a producer the loader stops is never reported)."""
        return self.exit_code is not None and (self.exit_code == 0 or -self.exit_code in (
            signal.SIGTERM, signal.SIGINT, signal.SIGHUP))

    def name(self) -> str:
        """``producer 1 (pid 4242, restart 2): exit code 4``."""
        restart = f", restart {self.generation}" if self.generation else ""
        return f"producer {self.index} (pid {self.pid}{restart}): {describe_exit(self.exit_code or 0)}"

    def report(self) -> str:
        """Its name and exit, and the tail of its error output: what an error raised for its death quotes."""
        return f"{self.name()}; its last error output:\n{self.tail()}"

    def last_line(self) -> str:
        """The last line it wrote to stderr (usually its exception's message), or ""."""
        lines = self._captured_tail().splitlines()
        return lines[-1].strip() if lines else ""

    def brief(self) -> str:
        """Its name and exit, and only the last line of its error output: what the log of its death quotes, as
        all it wrote has just gone to our stderr (:meth:`pump`)."""
        last = self.last_line()
        return self.name() + (f"; its last line on stderr: {last}" if last else
                              "; it wrote nothing to stderr once started")

    def release(self) -> None:
        """Close its pipe, capture file and sentinel (it has exited)."""
        for close in (lambda: os.close(self.stderr_fd), self.capture.close):
            try:
                close()
            except OSError:
                pass
        if self._own_sentinel and self.sentinel is not None:
            os.close(self.sentinel)
        if not isinstance(self.handle, subprocess.Popen):
            self.handle.close()


def reports(children: list[Child]) -> str:
    """Each child's :meth:`Child.report`; one whose error output ends as an earlier one's did (every producer
    failing on the same missing file) names that one instead of quoting the same traceback again."""
    quoted: dict[str, int] = {}  # a last line -> the producer whose report quotes it
    lines = []
    for child in children:
        last = child.last_line()
        if last in quoted:
            lines.append(f"{child.name()}; its error output ends as producer {quoted[last]}'s: {last}")
            continue
        if last:
            quoted[last] = child.index
        lines.append(child.report())
    return "\n".join(lines)


def _echo(chunk: bytes) -> None:
    """Show a producer's output on our stderr, as when it wrote there itself."""
    view = memoryview(chunk)
    while view:
        try:
            view = view[os.write(2, view):]
        except OSError:
            return


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: the watch thread polls the exit code instead
        return None
