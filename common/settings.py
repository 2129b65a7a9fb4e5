"""Options declared once: each one's type, default, bounds and documentation, and its producer flag and variable.

A :class:`Setting` is one option. Its *kind* (:mod:`ferry.common.kinds`: ``Int``, ``Real``, ``Bool``, ``Choice``,
``Text``, ``Path``, ``Hook``, ``Compression``, or a module's own) checks a value given in Python, reads the text
of a command-line flag or of a ``FERRY_*`` variable, and writes a value back as that text. The setting adds the
default, the documentation and its unit, and the producer's flag and variable where it has them.

A frozen dataclass declares a field as ``threads: int = option(THREADS)``: :func:`check_fields` (called by its
``__post_init__``) checks every such field, and :func:`documented` writes its ``Args:`` from the declarations.

Who reads the declarations:

* the consumer's option groups and flat keywords (:mod:`ferry.consumer.options`): checks, defaults, docs;
* :class:`ferry.producer.ProducerConfig`: checks, defaults, docs;
* the producer's command line (:mod:`ferry.producer.cli`): its flags, their help, its ``FERRY_*`` variables;
* local mode: a producer it starts gets every option that its ``ProducerConfig`` declares with the same
  :class:`Setting` as the loader's groups (:func:`shared_values`), and a producer started by spec gets that
  config as a command line (:func:`ferry.producer.cli.command_line`).

The declarations at the end of this module are the options both sides take. This module never imports torch.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from typing import Any

from ferry.common.constants import (
    DEFAULT_SLOTS, DEFAULT_THREADS, HEARTBEAT_S, MAX_HEARTBEAT_S, MAX_PORT, MAX_SLOTS, MAX_THREADS, MIN_HEARTBEAT_S,
    MIN_LIVENESS,
)
from ferry.common.constants import LIVENESS as DEFAULT_LIVENESS
from ferry.common.errors import ConfigError
from ferry.common.kinds import Bool, Choice, Compression, Hook, Int, KeywordArgs, Kind, Path, Real, Text

__all__ = [
    "Kind", "Int", "Real", "Bool", "Choice", "Text", "Path", "Hook", "KeywordArgs", "Compression", "Setting",
    "REQUIRED", "option", "setting_of", "check_fields", "documented", "shared_values",
    "THREADS", "SLOTS", "AHEAD", "HEARTBEAT", "LIVENESS", "TRANSFORM", "TRANSFORM_ARGS", "COLLATE", "COLLATE_ARGS", "INIT",
    "METRICS_PORT", "SEED_PER_SAMPLE",
]


class _Required:
    def __repr__(self) -> str:
        return "<required>"


#: The default of an option that has none: it must be given.
REQUIRED: Any = _Required()


# --- one option ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)  # a declaration is itself: compared by identity
class Setting:
    """One option: how its values are checked (``kind``), what it means (``doc``, ``unit``), its default, and
    the producer's flag and variable for it, if any.

    ``optional``: None is accepted too (the doc says what it means). ``env``: the variable, by default
    ``FERRY_`` and the flag's name (``--curve-server-key``: ``FERRY_CURVE_SERVER_KEY``).
    """

    kind: Kind
    doc: str
    default: Any = REQUIRED
    unit: str = ""
    optional: bool = False
    flag: str = ""
    env: str = ""
    metavar: str = ""

    @property
    def variable(self) -> str:
        """The ``FERRY_*`` variable that sets this option; "" when none does."""
        if self.env or not self.flag:
            return self.env
        return "FERRY_" + self.flag.lstrip("-").replace("-", "_").upper()

    def check(self, name: str, value: Any) -> Any:
        """``value``, checked and in its plain type; raises ConfigError naming ``name``."""
        return None if value is None and self.optional else self.kind.check(name, value)

    def read(self, environ: Mapping[str, str]) -> Any:
        """The variable's value; None when it is unset or empty.

        Raises:
            ConfigError: the text does not parse; the message names the variable, its text and what it should be.
        """
        text = environ.get(self.variable, "") if self.variable else ""
        if not text.strip():
            return None
        try:
            return self.kind.parse(text.strip())
        except (ValueError, TypeError):
            raise ConfigError(f"environment variable {self.variable}={text!r} is not {self.kind.expected}") from None

    def describe(self) -> str:
        """The doc, its unit and its default, as a docstring's ``Args:`` entry says them."""
        unit = f" [Unit: {self.unit}]" if self.unit else ""
        shown = self.default not in (REQUIRED, None, "") and self.default != {}
        return f"{self.doc}{unit}" + (f" Default: {self.default!r}." if shown else "")

    def help(self, variable: bool = True) -> str:
        """The flag's ``--help`` text: the doc, the default and (``variable``) the variable; ``%`` escaped for
        argparse."""
        shown = self.default not in (REQUIRED, None, "", False) and self.default != {}
        text = self.doc.rstrip(".") + (f" (default {self.kind.format(self.default)})" if shown else "")
        return (text + (f" [env {self.variable}]" if variable else "")).replace("%", "%%")


# --- dataclass fields declared by settings ------------------------------------------------------------
def option(setting: Setting, *, flat: str = "") -> Any:
    """A dataclass field declared by ``setting``: its default (a fresh copy of a mutable one) and its check.

    ``flat``: the name of the field's flat keyword on ``RemoteLoader`` (the consumer's groups).
    """
    metadata = {"setting": setting, "flat": flat}
    if setting.default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    if isinstance(setting.default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(setting.default)(setting.default), metadata=metadata)
    return dataclasses.field(default=setting.default, metadata=metadata)


def setting_of(field: dataclasses.Field) -> Setting:
    return field.metadata["setting"]


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of the frozen dataclass ``obj`` with its setting; errors name ``prefix`` + the field."""
    for field in dataclasses.fields(obj):
        value = setting_of(field).check(prefix + field.name, getattr(obj, field.name))
        object.__setattr__(obj, field.name, value)


def documented(cls: type) -> type:
    """Append to ``cls``'s docstring an ``Args:`` entry for each field, from its setting (and its flat keyword)."""
    lines = ["", "", "    Args:"]
    for field in dataclasses.fields(cls):
        flat = field.metadata["flat"]
        text = f"{field.name}: {setting_of(field).describe()}" + (f" Flat keyword: ``{flat}``." if flat else "")
        lines += textwrap.wrap(text, 114, initial_indent=" " * 8, subsequent_indent=" " * 12)
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n".join(lines) + "\n"
    return cls


def shared_values(target: type, *sources: Any) -> dict[str, Any]:
    """The fields of ``target`` that a field of one of ``sources`` (dataclass instances) declares with the same
    setting, with that field's value: what a parent passes on to the child it configures."""
    by_setting = {setting_of(f): getattr(source, f.name) for source in sources for f in dataclasses.fields(source)}
    return {f.name: by_setting[setting_of(f)] for f in dataclasses.fields(target) if setting_of(f) in by_setting}


# --- the options both sides take ----------------------------------------------------------------------
THREADS = Setting(Int(1, MAX_THREADS), "loading threads in each producer: the samples of a batch load concurrently. "
                  f"By default {DEFAULT_THREADS} for a built-in dataset, while a dataset class of your own is called "
                  "one sample at a time, as a DataLoader worker calls it, because its __getitem__ may not be "
                  "thread-safe (one open file it seeks in, a library that is not): give a number when it is.",
                  None, optional=True, flag="--threads")
SLOTS = Setting(Int(1, MAX_SLOTS), "batches each producer works on at once (with --ahead: its credit with each "
                "consumer).",
                DEFAULT_SLOTS, flag="--slots")
AHEAD = Setting(Int(0, MAX_SLOTS), "tasks each producer takes from each consumer beyond its slots, queued until a "
                "slot is free: a slot that finishes starts its next batch at once, instead of waiting for the "
                "consumer's credit to come back (none: as many as the slots, a window of twice the slots; 0: the "
                "slots only). The consumer's buffer_batches still bounds the batches buffered and in flight.",
                None, optional=True, flag="--ahead")
HEARTBEAT = Setting(Real(MIN_HEARTBEAT_S, MAX_HEARTBEAT_S),
                    "seconds between heartbeats (PINGs), on both sides; a consumer's WELCOME sets its own on the "
                    "producers.", HEARTBEAT_S, unit="second", flag="--heartbeat")
LIVENESS = Setting(Int(MIN_LIVENESS), "heartbeats of silence after which the other side is lost (a consumer "
                   "re-issues the producer's tasks; a producer says HELLO again).", DEFAULT_LIVENESS, flag="--liveness")
TRANSFORM = Setting(Hook(), "applied to every sample on the producer before collation, e.g. a crop or a "
                    "normalisation (it turns off the built-in datasets' read-into-batch fast path): a callable, "
                    "or a package.module:callable spec (the only form with a dataset spec or on the command line).",
                    None, optional=True, flag="--transform", metavar="CALLABLE")
COLLATE = Setting(Hook(), "merges a list of samples into a batch on the producer, in place of default_collate, as "
                  "DataLoader's collate_fn does (e.g. to pad variable-length sequences). Its output is what travels: "
                  "any tree of dicts, lists and tuples with array, tensor and scalar leaves. A callable or a spec, "
                  "as for the transform.", None, optional=True, flag="--collate", metavar="CALLABLE")
_HOOK_ARGS = ("KEY=VALUE, VALUE parsed as JSON when it parses, else taken as a string; repeatable (the variable: a JSON "
              "object). A function gets them as keywords (fn(x, **args)); a class is built with them (cls(**args)) "
              "and its instance is the hook.")
TRANSFORM_ARGS = Setting(KeywordArgs("transform argument"), "keyword arguments of the transform: " + _HOOK_ARGS, {},
                         flag="--transform-arg", env="FERRY_TRANSFORM_ARGS", metavar="KEY=VALUE")
COLLATE_ARGS = Setting(KeywordArgs("collate argument"), "keyword arguments of the collate function (e.g. "
                       "alpha=0.2 for a mixup): " + _HOOK_ARGS, {}, flag="--collate-arg", env="FERRY_COLLATE_ARGS",
                       metavar="KEY=VALUE")
INIT = Setting(Hook(), "called once in each producer process with its worker id, after its random, numpy and torch "
               "generators are seeded: DataLoader's worker_init_fn. A callable or a spec, as for the transform.",
               None, optional=True, flag="--init", metavar="CALLABLE")
METRICS_PORT = Setting(Int(0, MAX_PORT, expected="a port number"),
                       "serve the figures as Prometheus metrics on this port, on every interface (needs "
                       "ferry[metrics]); none by default. A loader under torchrun adds LOCAL_RANK to it, as to its "
                       "endpoint, so that each rank serves its own.",
                       None, optional=True, flag="--metrics-port", metavar="PORT")
SEED_PER_SAMPLE = Setting(
    Bool(), "seed torch's CPU generator, numpy's global one (np.random) and Python's random from (seed, epoch, index) "
    "before each sample of a map-style dataset, so that an augmentation drawn from them (torchvision's random "
    "transforms, np.random.rand) gives the same pixels whichever producer loads the sample, however many run, and "
    "after a re-issue, a respawn or a resume. Default (none): on where the producer loads one sample at a time (a "
    "dataset class of your own without --threads), off where loads overlap, since these generators are shared by "
    "the loading threads. 1: on, and the dataset's samples load one at a time; 0: off, each producer's generators "
    "run on from its process seed as a DataLoader worker's do (docs/datasets.md).", None, optional=True,
    flag="--seed-per-sample", metavar="0|1")
