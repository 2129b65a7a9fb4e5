"""Canary samples: admission checks the data, not only the files (docs/ARCHITECTURE.md#validation).

A fingerprint covers a dataset's class, its length and its files; it cannot see what ``__getitem__`` returns. A
producer started by hand with the validation transform on the training files, or a leftover one from a run with
another crop size, announced the trainer's fingerprint and was admitted. So both sides load a few *canary*
samples and compare what they hold:

* the indices are a function of the length alone (:func:`canary_indices`: the first and the last);
* each is loaded under the per-sample seeds of ``(CANARY_SEED, 0, index)`` (torch's, numpy's and Python's
  generators, :func:`ferry.common.sampleinfo.seed_generators`), so that a random transform drawn from them gives
  the same pixels on both sides, and the first once more: three loads in all, before the producer's first HELLO;
* each gives a :class:`Canary`: the sample's *structure* (containers, dtypes, shapes: :func:`structure`) and a
  *digest* of its values, or no digest where the first sample's two loads differ (a dataset with randomness of its
  own, which is then checked for structure only).

Ferry's built-in datasets announce none: their content is their files and decoding options, which their
fingerprints cover; a producer transform around one is the user's code, and is checked. A dataset that says
``canary = False`` announces none either (its samples cannot be loaded at start: they wait for something). A sample
slower than CANARY_BUDGET_S ends the probe there: the producer's start is delayed by one such load at most, and
that sample is then checked for its structure only.

A remote producer announces its canaries in its HELLO (``dataset.canary``); the consumer compares them with its own
(a trainer that holds the dataset object loads them itself, in its own process, its generators put back) or with
those of the first producer it admitted (a trainer given only a spec), and refuses a producer whose samples differ,
naming the sample and what differs (:func:`mismatch`). A loader's own local producers are its own copies of the
dataset and load none. A dataset whose samples differ from process to process by design (they name the process or
the host that loaded them) says ``canary_values = False``: only its structure is compared. This module imports
neither numpy nor torch itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Canary", "CANARY_SEED", "MAX_CANARIES", "canary_indices", "structure", "probe", "mismatch",
           "as_wire", "from_wire", "code_digest", "checked"]

#: The loader seed canary samples are loaded under (the trainer's own seed is not known when a producer opens).
CANARY_SEED = 0
#: A canary load slower than this ends the probe with that sample, checked for its structure only: a producer's
#: start waits for one slow load at most. [Unit: second]
CANARY_BUDGET_S = 2.0
#: At most this many canaries travel in a HELLO (and are checked on receipt).
MAX_CANARIES = 8
#: Bounds on the walk of one sample: deeper or larger samples are described as far as these go.
_MAX_DEPTH, _MAX_LEAVES = 16, 4096
#: A structure text longer than this is cut (it still differs where the samples differ early).
MAX_STRUCTURE_CHARS = 800


@dataclass(frozen=True)
class Canary:
    """One canary sample: its index, its structure in words, and the digest of its values (None: it varies)."""

    index: int
    structure: str
    digest: str | None


def canary_indices(length: int) -> list[int]:
    """The samples both sides load: the first and the last (one for a dataset of 1)."""
    return sorted({0, length - 1}) if length > 0 else []


def structure(sample: Any) -> str:
    """What a sample holds, in words: containers and their keys, each array's class, dtype and shape, each scalar's
    type. Two samples of one transform have the same structure; a crop of another size or a dtype changed by
    another normalisation do not."""
    words: list[str] = []
    _walk(sample, words, None, 0, [0])
    return "".join(words)[:MAX_STRUCTURE_CHARS]


def _digest_of(sample: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    words: list[str] = []
    _walk(sample, words, digest, 0, [0])
    digest.update("".join(words).encode())
    return digest.hexdigest()


def _walk(value: Any, words: list[str], digest: Any, depth: int, leaves: list[int]) -> None:
    """Describe ``value`` into ``words`` and, with a ``digest``, feed it its values."""
    leaves[0] += 1
    if depth > _MAX_DEPTH or leaves[0] > _MAX_LEAVES:
        words.append("…")
        return
    array = _as_array(value)
    if array is not None:
        words.append(f"{type(value).__name__} {array.dtype} {tuple(array.shape)}")
        if digest is not None:
            digest.update(array.tobytes())
        return
    if isinstance(value, dict):
        words.append(f"{type(value).__name__}{{")
        for key, item in value.items():
            words.append(f"{key!r}: ")
            _walk(item, words, digest, depth + 1, leaves)
            words.append(", ")
        words.append("}")
        return
    if isinstance(value, (list, tuple)):
        words.append(f"{type(value).__name__}[")
        for item in value:
            _walk(item, words, digest, depth + 1, leaves)
            words.append(", ")
        words.append("]")
        return
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        words.append(type(value).__name__)
        if digest is not None:
            digest.update(repr(value).encode())
        return
    to_bytes = getattr(value, "tobytes", None)  # an image of PIL's: its mode and size are its structure
    if callable(to_bytes):
        words.append(f"{type(value).__name__} {getattr(value, 'mode', '')} {getattr(value, 'size', '')}".rstrip())
        if digest is not None:
            digest.update(to_bytes())
        return
    words.append(type(value).__name__)
    if digest is not None:
        digest.update(repr(value).encode())  # an object's repr may name its address: its digest then varies


def _as_array(value: Any) -> Any:
    """A numpy view of an array leaf (a numpy array or scalar, a torch tensor on any device), or None."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return numpy.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        from ferry.common.arrays import as_array

        return as_array(value.detach().cpu())
    return None


def probe(dataset: Any, indices: Iterable[int], *, in_trainer: bool = False) -> list[Canary]:
    """Load each of ``indices`` under its per-sample seeds, and the first once more, and describe them (without
    digests where the first's two loads differ). A sample that raises is described by its exception's type.
    ``in_trainer``: the loads run in the training process, whose generators are put back."""
    from ferry.common.sampleinfo import kept_generators, loading

    def load(index: int) -> tuple[str, str]:
        with loading(CANARY_SEED, 0, index, seed_globals=True):
            try:
                sample = dataset[index]
            except Exception as exc:  # described, compared like any outcome: the other side's may differ
                return f"raised {type(exc).__name__}", f"raised {type(exc).__name__}"
        return structure(sample), _digest_of(sample)

    indices = list(indices)
    if not indices:
        return []
    with kept_generators() if in_trainer else contextlib.nullcontext():
        start = time.monotonic()
        loaded = [load(indices[0])]
        if time.monotonic() - start > CANARY_BUDGET_S:  # slow samples: one load is all the start may wait for
            return [Canary(indices[0], loaded[0][0], None)]
        loaded += [load(index) for index in indices[1:]]
        values = values_compared(dataset) and load(indices[0])[1] == loaded[0][1]
    return [Canary(index, shape, digest if values else None) for index, (shape, digest) in zip(indices, loaded)]


def checked(dataset: Any) -> bool:
    """Whether a map-style dataset's canaries are loaded at all: not for Ferry's own built-in datasets (their
    fingerprint covers their files and options), but for a user's, or a producer transform around a built-in; not
    for one that says ``canary = False``."""
    from ferry.common.datasets import Transformed

    inner = dataset
    while isinstance(inner, Transformed):
        inner = inner.dataset
    if getattr(inner, "canary", True) is False:
        return False
    return isinstance(dataset, Transformed) or not type(dataset).__module__.startswith("ferry.")


def values_compared(dataset: Any) -> bool:
    """Whether a dataset's canary values are compared: not where it says ``canary_values = False`` (its samples name
    the process, the host or the time that made them, so they differ from producer to producer by design; only
    their structure is compared), looked up through a producer transform's wrapper too."""
    from ferry.common.datasets import Transformed

    while True:
        flag = getattr(dataset, "canary_values", None)
        if flag is not None:
            return bool(flag)
        if not isinstance(dataset, Transformed):
            return True
        dataset = dataset.dataset


def mismatch(expected: list[Canary], announced: list[Canary], whose: str) -> str | None:
    """Why ``announced`` (a producer's) shows other data than ``expected`` (``whose``: "this trainer's", "the first
    producer's (host:pid)"), or None. Samples compare by structure, and by digest where both have one."""
    theirs = {canary.index: canary for canary in announced}
    for mine in expected:
        other = theirs.get(mine.index)
        if other is None:
            continue
        if other.structure != mine.structure:
            return (f"its sample {mine.index} is {other.structure}, {whose} is {mine.structure}: another "
                    "transform, crop size or dtype (docs/troubleshooting.md#a-producer-is-refused)")
        if mine.digest is not None and other.digest is not None and mine.digest != other.digest:
            return (f"its sample {mine.index} holds other values than {whose}, of the same structure "
                    f"({mine.structure}): other files, another version of the dataset's code, or a transform drawing "
                    "from a generator of its own; a dataset whose samples name the process that made them says "
                    "canary_values = False (docs/troubleshooting.md#a-producer-is-refused)")
    return None


def as_wire(canaries: list[Canary]) -> list[list[Any]]:
    """HELLO's ``dataset.canary``: ``[[index, structure, digest or None], ...]``."""
    return [[c.index, c.structure, c.digest] for c in canaries[:MAX_CANARIES]]


def from_wire(value: list[list[Any]]) -> list[Canary]:
    return [Canary(int(index), shape, digest) for index, shape, digest in value]


def valid_wire(value: Any, max_text: int) -> bool:
    """Whether a HELLO's ``dataset.canary`` is well formed (common/protocol.py)."""
    return (isinstance(value, list) and len(value) <= MAX_CANARIES
            and all(isinstance(c, list) and len(c) == 3 and isinstance(c[0], int) and not isinstance(c[0], bool)
                    and 0 <= c[0] < (1 << 63) and isinstance(c[1], str) and len(c[1]) <= max_text
                    and (c[2] is None or (isinstance(c[2], str) and len(c[2]) <= 64)) for c in value))


def code_digest(spec: str) -> str | None:
    """A digest of the source file of a ``package.module:callable`` spec's module, found without importing anything
    (the module's ``__file__`` where it is loaded already, else on ``sys.path``); None for a built-in name or a
    module not found. Two producers (or a producer and the trainer) whose digests differ run other code for the same
    spec: a stale producer left over from another version, which the canary samples catch where their outputs
    differ, and which the consumer warns about where they do not."""
    module, colon, _ = spec.partition(":")
    if not colon or not module:
        return None
    path = getattr(sys.modules.get(module), "__file__", None) or _module_file(module)
    if path is None:
        return None
    try:
        with open(path, "rb") as source:
            return hashlib.blake2b(source.read(), digest_size=16).hexdigest()
    except OSError:
        return None


def _module_file(module: str) -> str | None:
    parts = module.split(".")
    for root in sys.path:
        base = os.path.join(root or os.getcwd(), *parts)
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
    return None
