"""ImageFolder's folder layout, shared by ``npy-folder`` and ``image-folder``."""

from __future__ import annotations

import hashlib
import os

from typing import Any, Sequence

__all__ = ["scan_class_folders", "files_digest", "folder_samples"]


def scan_class_folders(root: str, extensions: tuple[str, ...] | None, kind: str,
                       fold_case: bool = True) -> tuple[list[str], list[tuple[str, int]], str]:
    """ImageFolder's layout: ``root/<class>/<file>``, classes sorted, a label its class's position, files sorted
    within a class. Returns the classes, the ``(path, label)`` samples and a fingerprint of names and sizes.
    ``fold_case``: match extensions case-insensitively. ``extensions`` None: every file of a class folder whose
    name does not start with a dot, whatever its extension."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples: list[tuple[str, int]] = []

    def wanted(entry: os.DirEntry) -> bool:
        if extensions is None:
            return not entry.name.startswith(".") and entry.is_file()
        ext = os.path.splitext(entry.name)[1]
        return (ext.lower() if fold_case else ext) in extensions

    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        files = sorted(e.name for e in os.scandir(folder) if wanted(e))
        samples.extend((os.path.join(folder, f), label) for f in files)
    return classes, samples, f"{kind}:{len(samples)}:{files_digest(root, samples)}"


def files_digest(root: str, samples: Sequence[tuple[str, Any]]) -> str:
    """A digest of each sample's path relative to ``root``, its label and its file's size, in sample order: two
    folders agree when they list the same files, as large, under the same labels, in the same order (a renamed
    class or a replaced file changes it; a file that cannot be read counts as size -1)."""
    digest = hashlib.sha1()
    for path, label in samples:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        digest.update(f"{os.path.relpath(path, root)}:{label}:{size}\n".encode())
    return digest.hexdigest()[:16]


def folder_samples(dataset: Any) -> tuple[str, list[tuple[str, Any]]] | None:
    """``(root, samples)`` of a dataset laid out as torchvision's ``DatasetFolder`` (``ImageFolder``) is: a ``root``
    folder and ``samples``, a list of ``(path, label)``; None for any other dataset."""
    root, samples = getattr(dataset, "root", None), getattr(dataset, "samples", None)
    if not isinstance(root, (str, os.PathLike)) or not isinstance(samples, (list, tuple)):
        return None
    if not all(isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], (str, os.PathLike)) for s in samples):
        return None
    return os.fspath(root), [(os.fspath(path), label) for path, label in samples]
