"""The private temporary folder of a trainer's local producers: made, marked, removed, swept.

Each folder (``$TMPDIR/ferry-XXXXXXXX``) holds the ipc socket and the producers' captured error output, and
an ``owner`` file naming the process that made it: ``<pid> <start time> <pid namespace>``. It is removed:

* on a normal close (:func:`remove`), and at interpreter exit through the loader's finalizer;
* on SIGTERM and SIGINT: a handler, installed in the main thread while a folder exists, chains to the one it
  replaced. Where that one would kill the process outright (``SIG_DFL``, SIGTERM's default), it first removes
  this process's folders, then the process dies of the signal as before. Where it is Python code (SIGINT's
  KeyboardInterrupt, or the program's own), the program decides: it may carry on, so its folder stays, and
  the loader's close (``with``, or its finalizer at exit) removes it on the way out;
* after a SIGKILL, nothing can run: the next trainer sweeps the folder (:func:`sweep_stale`). Only folders
  of this user, with an ``owner`` file, whose owner is in this pid namespace and no longer runs, are swept;
  a folder without an owner file (someone else's, or one being made right now) is never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
from typing import Any

log = logging.getLogger("ferry.consumer")

PREFIX = "ferry-"
OWNER_FILE = "owner"
_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = threading.RLock()
_folders: dict[str, int] = {}  # folder -> pid of the process that made it (a forked child inherits this)
_previous: dict[int, Any] = {}  # signal -> the handler ours replaced, while ours is installed


def create() -> str:
    """Sweep stale folders, then make, mark and register a new one. Returns its path."""
    sweep_stale()
    folder = tempfile.mkdtemp(prefix=PREFIX)
    marker = os.path.join(folder, OWNER_FILE)
    with open(marker + ".tmp", "w") as f:  # written whole, then renamed: a sweeper never reads half of it
        f.write(_identity(os.getpid()) + "\n")
    os.rename(marker + ".tmp", marker)
    with _lock:
        _folders[folder] = os.getpid()
        _install_handlers()
    return folder


def remove(folder: str) -> None:
    """Remove ``folder`` and forget it; restore the signal handlers when it was the last one."""
    with _lock:
        _folders.pop(folder, None)
        if not _folders:
            _restore_handlers()
    shutil.rmtree(folder, ignore_errors=True)


def sweep_stale(root: str | None = None) -> list[str]:
    """Remove the folders in ``root`` (default: the temp folder) that a dead trainer left. Returns them."""
    root = root or tempfile.gettempdir()
    swept = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(PREFIX)]
    except OSError:
        return swept
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            with open(os.path.join(entry.path, OWNER_FILE)) as f:
                owner = f.read().split()
        except OSError:  # no owner file: not a folder of ours, or one being made right now
            continue
        if _owner_is_gone(owner):
            shutil.rmtree(entry.path, ignore_errors=True)
            swept.append(entry.path)
            log.info("ferry: removed %s, left behind by process %s", entry.path, owner[0])
    return swept


# --- who owns a folder --------------------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if it is gone or
    a zombie (a zombie can clean up nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _identity(pid: int) -> str:
    return f"{pid} {_start_time(pid) or '-'} {_pid_namespace()}"


def _owner_is_gone(owner: list[str]) -> bool:
    """True only when the owner surely no longer runs: same pid namespace, and its pid is free or reused."""
    if len(owner) != 3 or not owner[0].isdigit() or owner[2] != _pid_namespace() or owner[2] == "-":
        return False
    started = _start_time(int(owner[0]))
    return started is None or started != owner[1]


# --- signals -----------------------------------------------------------------------------------------
def _install_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; close() and the finalizer still remove the folder
    for signum in _SIGNALS:
        current = signal.getsignal(signum)
        if signum in _previous or current in (signal.SIG_IGN, None):  # ours already, or ignored / not ours
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)


def _restore_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # ours stays and only chains: it has nothing left to remove
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _on_signal:  # never undo a handler someone installed after ours: it
            signal.signal(signum, previous)  # may chain to ours, which then still chains to the one before
            del _previous[signum]


def _remove_all_of_this_process() -> None:
    with _lock:
        mine = [folder for folder, pid in _folders.items() if pid == os.getpid()]
    for folder in mine:
        shutil.rmtree(folder, ignore_errors=True)


def _on_signal(signum: int, frame: Any) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:  # the process is about to die: clean up, then die of the signal as before
        _remove_all_of_this_process()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
