"""Dataset specs and the built-in datasets (one module each: :mod:`.synthetic`, :mod:`.npy`, :mod:`.images`,
:mod:`.packed`, :mod:`.rds`; what they share is in :mod:`.folders`).

A *spec* names a map-style dataset (``__len__`` + ``__getitem__``), a sharded one (``shards()`` +
``iter_shard(name)``, see :mod:`ferry.common.shardplan`) or an iterable one (a torch ``IterableDataset``, see
:mod:`ferry.common.streamplan`), that a producer builds for itself:

* a built-in name: ``synthetic``, ``npy-folder``, ``image-folder``, ``rds-folder``, ``packed`` or ``tar-shards`` (see
  :data:`BUILTINS`);
* ``package.module:callable``: a class or factory, called with the spec's keyword arguments.

``--dataset-arg key=value`` values are parsed as JSON when they parse, else taken as strings.

Every dataset has a *fingerprint*: a short string that two producers of the same data agree on. A
dataset may define ``fingerprint`` (a str attribute or a method); otherwise it is the class's qualified
name, the length (an iterable dataset: ``iterable`` and its ``len()`` where it has one) and, for a folder
dataset laid out as torchvision's ``DatasetFolder`` (``root`` and ``samples``, a list of ``(path, label)``), a
digest of each file's relative path, label and size. The
built-in datasets cover their content (files, or shard names and sizes) and their decoding options. The
consumer rejects a producer whose fingerprint differs from the first one's.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
import textwrap
from typing import Any, Callable, Iterable

from ferry.common.datasets.folders import files_digest, folder_samples, scan_class_folders
from ferry.common.datasets.images import ImageFolderDataset
from ferry.common.datasets.npy import NpyFolderDataset, read_npy_header, read_npy_into
from ferry.common.datasets.packed import PackedDataset
from ferry.common.datasets.rds import RdsFolderDataset
from ferry.common.datasets.synthetic import SyntheticDataset
from ferry.common.datasets.tarshards import TarShardsDataset
from ferry.common.errors import ConfigError, DatasetSpecError, MissingExtraError, SampleLoadError
from ferry.common.kinds import parse_keyword_args
from ferry.common.shardplan import is_sharded, shard_fingerprint, shard_names
from ferry.common.streamplan import check_iterable, is_iterable, iterable_len

__all__ = [
    "BUILTINS",
    "describe_builtins",
    "SyntheticDataset",
    "NpyFolderDataset",
    "SampleLoadError",
    "ImageFolderDataset",
    "PackedDataset",
    "RdsFolderDataset",
    "TarShardsDataset",
    "MissingExtraError",
    "Transformed",
    "resolve_dataset",
    "resolve_callable",
    "parse_dataset_args",
    "bind_hook",
    "dataset_fingerprint",
    "read_npy_header",
    "read_npy_into",
    "scan_class_folders",
]


#: Built-in dataset names and their factories.
BUILTINS: dict[str, Callable[..., Any]] = {
    "synthetic": SyntheticDataset,
    "npy-folder": NpyFolderDataset,
    "packed": PackedDataset,
    "image-folder": ImageFolderDataset,
    "rds-folder": RdsFolderDataset,  # R's saveRDS files, as an R torch user keeps them
    "tar-shards": TarShardsDataset,  # a sharded (streaming) source: WebDataset .tar files
}

#: What each built-in serves, in a line: ``python -m ferry.producer --help`` lists them (:func:`describe_builtins`).
ABOUT = {
    "synthetic": "generated (array, label) samples whose content depends only on the index; delay: seconds per "
                 "sample, standing in for storage",
    "npy-folder": ".npy files in class folders, root/<class>/<name>.npy, labelled as torchvision's ImageFolder",
    "packed": "the fixed-size records ferry pack writes: one read per sample, the fastest",
    "image-folder": "PNG, JPEG and TIFF in class folders as (C, H, W) arrays; ordinary photos need mode=RGB and "
                    "resize/crop (or a --transform) to batch (pip install 'ferry[images]')",
    "rds-folder": "R's saveRDS files (numeric vectors or arrays, any extension) in class folders, filled into shape "
                  "as R's array(x, dim = shape); dtype float32 by default (pip install 'ferry[rds]')",
    "tar-shards": "WebDataset .tar shards (a glob or a folder), streamed shard by shard; shuffle_buffer shuffles "
                  "within each shard; mode/resize/crop decode images as image-folder does",
}


def describe_builtins(width: int = 110) -> str:
    """Every built-in with its keyword arguments (and their defaults) and what it serves, wrapped to ``width``."""
    lines = []
    for name, factory in BUILTINS.items():
        arguments = [p.name if p.default is p.empty else f"{p.name}={json.dumps(p.default)}"
                     for p in inspect.signature(factory).parameters.values()]
        text = f"{name} {' '.join(arguments)}: {ABOUT.get(name, '')}"
        lines += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def resolve_dataset(spec: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Build the dataset a spec names.

    Raises:
        DatasetSpecError: the spec is malformed, its module or attribute is missing, the factory raised,
            or what it returned is not a map-style dataset. The message names the spec and the cause.
    """
    kwargs = dict(kwargs or {})
    if not isinstance(spec, str) or not spec:
        raise DatasetSpecError(f"dataset spec must be a non-empty string, got {spec!r}")
    if spec in BUILTINS:
        factory = BUILTINS[spec]
    elif ":" in spec:
        factory = resolve_callable(spec, "dataset spec")
    else:
        raise DatasetSpecError(
            f"dataset spec {spec!r} is neither a built-in ({', '.join(sorted(BUILTINS))}) "
            "nor 'package.module:callable'"
        )
    try:
        dataset = factory(**kwargs)
    except Exception as exc:
        raise DatasetSpecError(f"dataset spec {spec!r} with {kwargs!r} failed: {type(exc).__name__}: {exc}") from exc
    if is_sharded(dataset):
        return dataset
    if is_iterable(dataset):
        try:
            check_iterable(dataset)
        except ConfigError as exc:
            raise DatasetSpecError(f"dataset spec {spec!r}: {exc}") from None
        return dataset
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise DatasetSpecError(f"dataset spec {spec!r} returned {type(dataset).__name__}, neither a map-style "
                               "dataset (__len__, __getitem__), a sharded one (shards(), iter_shard(name)) nor an "
                               "iterable one (__iter__)")
    return dataset


def transformed_fingerprint(fingerprint: str, transform: Any, args: dict[str, Any] | None = None) -> str:
    """The fingerprint of a dataset whose samples pass through ``transform`` (a spec, or a callable, named
    by its module and qualified name) with its keyword arguments ``args``: a producer applying another
    transform serves another stream."""
    if not isinstance(transform, str):
        module = getattr(transform, "__module__", "?")
        module = "__main__" if module == "__mp_main__" else module
        transform = f"{module}:{getattr(transform, '__qualname__', type(transform).__qualname__)}"
    told = f"{fingerprint}|transform={transform}"
    return told + (f"({', '.join(f'{k}={v!r}' for k, v in sorted(args.items()))})" if args else "")


class Transformed:
    """A dataset whose samples pass through ``transform`` (a producer-side, per-sample hook): a callable, or
    the ``package.module:callable`` spec of one, with its keyword arguments ``args`` (see :func:`bind_hook`)."""

    def __new__(cls, dataset: Any, transform: Any, args: dict[str, Any] | None = None) -> "Transformed":
        if cls is Transformed and is_sharded(dataset):  # the sharded contract passes through, transformed
            return super().__new__(TransformedShards)
        if cls is Transformed and is_iterable(dataset):  # so does an iterable dataset's
            return super().__new__(TransformedStream)
        return super().__new__(cls)

    def __init__(self, dataset: Any, transform: Any, args: dict[str, Any] | None = None) -> None:
        self.dataset, self.spec = dataset, transform
        self.transform = bind_hook(transform, args, "transform")
        self.fingerprint = transformed_fingerprint(dataset_fingerprint(dataset), transform, args)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.transform(self.dataset[index])


class TransformedShards(Transformed):
    """A sharded dataset whose samples pass through ``transform``."""

    def __len__(self) -> int:
        raise TypeError("a sharded dataset has no len(); see shards() and shard_len()")

    def shards(self) -> list[str]:
        return self.dataset.shards()

    def iter_shard(self, name: str) -> Any:
        return (self.transform(sample) for sample in self.dataset.iter_shard(name))

    def __getattr__(self, name: str) -> Any:  # shard_len, only where the dataset has it
        if name in ("shard_len", "shuffle_buffer") and "dataset" in self.__dict__:
            return getattr(self.dataset, name)
        raise AttributeError(name)


class TransformedStream(Transformed):
    """An iterable dataset whose samples pass through ``transform``; ``len()`` where the dataset has one."""

    __getitem__ = None  # type: ignore[assignment]  # no map: is_iterable() reads the class's __getitem__

    def __iter__(self) -> Any:
        return (self.transform(sample) for sample in self.dataset)


def resolve_callable(spec: str, what: str = "transform") -> Any:
    """``package.module:callable`` -> the callable, with errors that name the spec."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise DatasetSpecError(f"{what} {spec!r} must look like 'package.module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise DatasetSpecError(f"{what} {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DatasetSpecError(f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise DatasetSpecError(f"{what} {spec!r}: {attr_path!r} is not callable")
    return obj


def parse_dataset_args(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are JSON when they parse, else plain strings.

    Raises:
        DatasetSpecError: a string that is not ``key=value``.
    """
    return parse_keyword_args(pairs, "dataset argument")


def bind_hook(hook: Any, args: dict[str, Any] | None, what: str) -> Any:
    """``hook`` (a callable or its ``package.module:callable`` spec) with its keyword arguments ``args``: a class is
    built with them and its instance is the hook; a function gets them as keywords on every call
    (``functools.partial``). Without arguments, the callable itself.

    Raises:
        DatasetSpecError: the spec cannot be resolved, the function does not take these keywords, or building the
            class raised; the message names the hook.
    """
    fn = resolve_callable(hook, what) if isinstance(hook, str) else hook
    if not args:
        return fn
    name = hook if isinstance(hook, str) else getattr(fn, "__qualname__", repr(fn))
    if isinstance(fn, type):
        try:
            return fn(**args)
        except Exception as exc:
            raise DatasetSpecError(f"{what} {name} with {args!r} failed: {type(exc).__name__}: {exc}") from exc
    try:
        inspect.signature(fn).bind(None, **args)  # the sample (or samples) and the arguments
    except TypeError as exc:
        raise DatasetSpecError(f"{what} {name} does not take {args!r}: {exc}") from None
    except ValueError:  # no signature to check (some builtins): the first call tells
        pass
    return functools.partial(fn, **args)


def importable_module(module: str) -> str:
    """The name a producer imports a class's module by. A class defined in the training script is ``__main__.X``
    there, ``__mp_main__.X`` in a spawned producer, and ``train.X`` in a producer started by hand with ``--dataset
    train:X``: all three are the script's module name (``python -m pkg.train``: ``pkg.train``; ``python
    train.py``: ``train``). Without a script (an interactive session), ``__main__``."""
    if module not in ("__main__", "__mp_main__"):
        return module
    main = sys.modules.get(module)
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "__mp_main__"):
        return spec.name
    path = getattr(main, "__file__", None)
    return os.path.splitext(os.path.basename(path))[0] if path else "__main__"


def dataset_fingerprint(dataset: Any) -> str:
    """The dataset's own ``fingerprint`` if it has one, else its class's qualified name and its length, and for
    a folder dataset a digest of its files (see the module docstring)."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        own = own()
    if own is not None:
        return str(own)
    if is_sharded(dataset):
        return shard_fingerprint(dataset, shard_names(dataset))
    cls = type(dataset)
    module = importable_module(cls.__module__)
    if is_iterable(dataset):  # no index to check: its class, and its length where it has one
        length = iterable_len(dataset)
        return f"{module}.{cls.__qualname__}:iterable" + (f":{length}" if length is not None else "")
    folder = folder_samples(dataset)
    files = f":files={files_digest(*folder)}" if folder is not None else ""
    return f"{module}.{cls.__qualname__}:{len(dataset)}{files}"
