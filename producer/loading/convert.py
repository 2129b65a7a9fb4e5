"""What an unbatched loader (``batch_size=None``) does to each sample, in numpy: ``default_convert``'s output types.

DataLoader's ``default_convert`` makes tensors of numpy arrays and numpy scalars and leaves everything else as it
is; here numpy arrays stay arrays, which the consumer's staging turns into tensors, and a numpy scalar becomes a
0-d array (a 0-d tensor in the trainer). As ``default_convert``: string and object arrays and numpy's string
scalars are left as they are, a namedtuple keeps its class, a tuple becomes a list, a mapping or other sequence
keeps its class where ``default_convert`` keeps it (:func:`ferry.producer.loading.collate.keep_type`), and numbers,
strings, tensors and other objects stay as they are.

No torch import: a producer stays light unless its dataset needs torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.producer.loading.collate import keep_type

__all__ = ["convert"]


def convert(sample: Any) -> Any:
    """``sample`` as ``default_convert`` leaves it, with numpy arrays in place of tensors (see the module
    docstring)."""
    if isinstance(sample, np.ndarray):
        return sample
    if isinstance(sample, np.generic):
        return sample if isinstance(sample, (str, bytes)) else np.asarray(sample)
    if isinstance(sample, (str, bytes)):
        return sample
    if isinstance(sample, Mapping):
        return keep_type(sample, {key: convert(sample[key]) for key in sample})
    if isinstance(sample, tuple):
        if hasattr(type(sample), "_fields"):  # a namedtuple stays one
            return type(sample)(*(convert(value) for value in sample))
        return [convert(value) for value in sample]  # as default_convert: a list
    if isinstance(sample, Sequence):
        return keep_type(sample, [convert(value) for value in sample])
    return sample
