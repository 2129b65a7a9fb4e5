"""The relay's payload files: a batch's arrays written where a client on this machine reads them at file speed.

R's socket connections read 4 KiB at a time (about 200 MB/s here), its file connections with one ``fread`` (about
1 GB/s), so a client on the relay's machine may ask (``payload file`` in its hello) for each batch's arrays in a
file: one per slot, at most ``slots`` (the client's window), in a private folder (mode 0700, under ``/dev/shm``
where it can be written, else the temporary folder), removed when the relay stops. A slot is written only while
no item the client has not consumed uses it (the core hands slots out). Space is reserved before the write
(``posix_fallocate``), so a full ``/dev/shm`` is an error the caller handles (it sends that batch inline), never a
SIGBUS in the middle of a write into a mapping.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile

from ferry.consumer.relay.framing import part_nbytes
from ferry.consumer.relay.leaves import Leaf, write_array

__all__ = ["PayloadFiles"]

_SHM = "/dev/shm"


class PayloadFiles:
    """Slot files ``slot-<n>`` in a private folder; see the module docstring."""

    def __init__(self) -> None:
        where = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None
        self.folder = tempfile.mkdtemp(prefix="ferry-relay-", dir=where)  # mode 0700
        self._files: dict[int, tuple[int, mmap.mmap | None, int]] = {}  # slot -> (fd, mapping, its size)

    def write(self, slot: int, leaves: list[Leaf], order: str) -> str:
        """Write the array leaves, back to back, into slot ``slot``'s file; its name.

        Raises:
            OSError: no room for them (the caller sends them inline instead).
        """
        total = sum(part_nbytes(leaf.part) for leaf in leaves)
        name = f"slot-{slot}"
        fd, mapping, size = self._files.get(slot) or (os.open(os.path.join(self.folder, name),
                                                              os.O_RDWR | os.O_CREAT, 0o600), None, 0)
        self._files[slot] = (fd, mapping, size)
        if total > size or mapping is None:
            if mapping is not None:
                mapping.close()
            if total > size:
                os.posix_fallocate(fd, 0, total)  # ENOSPC here, not SIGBUS below
                size = total
            mapping = mmap.mmap(fd, size) if size else None
            self._files[slot] = (fd, mapping, size)
        view = memoryview(mapping) if mapping is not None else memoryview(b"")
        at = 0
        try:
            for leaf in leaves:
                n = part_nbytes(leaf.part)
                write_array(view[at:at + n], leaf, order)
                at += n
        finally:
            view.release()
        return name

    def close(self) -> None:
        """Unmap and close every slot and remove the folder. Idempotent."""
        for fd, mapping, _ in self._files.values():
            if mapping is not None:
                mapping.close()
            os.close(fd)
        self._files.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
