"""The private temporary folder of a trainer's local producers: made, marked, removed, swept.

Each folder (``$TMPDIR/ferry-XXXXXXXX``) holds the ipc socket and the producers' captured error output, and
an ``owner`` file naming the process that made it: ``<pid> <start time> <pid namespace>``. It is removed:

* on a normal close (:func:`remove`), and at interpreter exit through the loader's finalizer. That covers a
  trainer that leaves through Python: the end of the script, an exception, SIGINT's KeyboardInterrupt, or a
  signal handler of the program's own that raises or calls ``sys.exit``;
* after a death that runs no Python (SIGKILL, or SIGTERM with its default action, which kills at once): the
  next trainer that makes a folder sweeps it (:func:`sweep_stale`). Only folders of this user, with an
  ``owner`` file, whose owner is in this pid namespace and no longer runs, are swept; a folder without an
  owner file (someone else's, or one being made right now) is never touched.

No signal handler is installed: the trainer's signals stay its program's (STYLE.md, rule 12).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

log = logging.getLogger("ferry.consumer")

PREFIX = "ferry-"
OWNER_FILE = "owner"


def create() -> str:
    """Sweep stale folders, then make and mark a new one. Returns its path."""
    sweep_stale()
    folder = tempfile.mkdtemp(prefix=PREFIX)
    marker = os.path.join(folder, OWNER_FILE)
    with open(marker + ".tmp", "w") as f:  # written whole, then renamed: a sweeper never reads half of it
        f.write(_identity(os.getpid()) + "\n")
    os.rename(marker + ".tmp", marker)
    return folder


def remove(folder: str) -> None:
    """Remove ``folder`` and everything in it."""
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
