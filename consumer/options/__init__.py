"""RemoteLoader's options: the keywords a user may pass, their declarations, their checks and their resolution.

The DataLoader-shaped options are flat keywords (``batch_size``, ``shuffle``, ``sampler`` …), each declared in
:mod:`~ferry.consumer.options.keywords`. Three groups of options that belong together are small frozen
dataclasses, checked when they are built (:mod:`~ferry.consumer.options.groups`):

* :class:`LocalOptions` (``local=``): producer processes that the loader starts on this machine;
* :class:`TransportOptions` (``transport=``): heartbeats, liveness, the task timeout and the message bound;
* :class:`CurveOptions` (``curve=``): encryption and authentication of remote producers.

Each group field has a flat keyword too (``local_producers``, ``heartbeat``, ``curve_secret_key`` …), the
shorthand that has always worked. A group and one of its flat keywords together are a :class:`ConfigError`:
one option, one place. :func:`resolve_options` (:mod:`~ferry.consumer.options.resolve`) checks everything
before the loader starts any thread or process; :class:`Option` makes the result the loader's read-only
attributes (:mod:`~ferry.consumer.options.read_only`). No module here imports torch at import time.
"""

from ferry.consumer.options.groups import UNSET, CurveOptions, LocalOptions, TransportOptions
from ferry.consumer.options.keywords import DATALOADER_ONLY, KEYWORDS, check_unknown_keywords, document_keywords
from ferry.consumer.options.read_only import Option
from ferry.consumer.options.resolve import (
    LoaderOptions, env_int, resolve_options, warn_excessive_producers, warn_unknown_environment,
)

__all__ = ["LocalOptions", "TransportOptions", "CurveOptions", "LoaderOptions", "resolve_options", "UNSET",
           "KEYWORDS", "DATALOADER_ONLY", "check_unknown_keywords", "document_keywords", "Option", "env_int",
           "warn_excessive_producers", "warn_unknown_environment"]
