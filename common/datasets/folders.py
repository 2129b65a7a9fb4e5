"""ImageFolder's folder layout, shared by ``npy-folder`` and ``image-folder``."""

from __future__ import annotations

import hashlib
import os

__all__ = ["scan_class_folders"]


def scan_class_folders(root: str, extensions: tuple[str, ...], kind: str,
                       fold_case: bool = True) -> tuple[list[str], list[tuple[str, int]], str]:
    """ImageFolder's layout: ``root/<class>/<file>``, classes sorted, a label its class's position, files sorted
    within a class. Returns the classes, the ``(path, label)`` samples and a fingerprint of names and sizes.
    ``fold_case``: match extensions case-insensitively."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        files = sorted(f for f in os.listdir(folder)
                       if (os.path.splitext(f)[1].lower() if fold_case else os.path.splitext(f)[1]) in extensions)
        samples.extend((os.path.join(folder, f), label) for f in files)
    digest = hashlib.sha1()
    for path, label in samples:
        digest.update(f"{os.path.relpath(path, root)}:{label}:{os.path.getsize(path)}\n".encode())
    return classes, samples, f"{kind}:{len(samples)}:{digest.hexdigest()[:16]}"
