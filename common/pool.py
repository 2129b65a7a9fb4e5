"""A producer pool's protocol rule (docs/ARCHITECTURE.md#messages): which dataset a consumer names to a producer,
and what a consumer answers to a HELLO. Pure functions, no sockets; both sides use them.

A producer is a *pool*: besides the dataset it was started with (``--dataset``, its *own*, announced as today), it
loads the dataset a consumer names in its WELCOME (``dataset``: ``{spec, args}``) from the built-ins or from the
specs it was started to allow (``--allow-dataset``). Every HELLO of a producer says ``pool: true``. The exchange:

1. the producer says HELLO announcing what the connection serves: its own dataset, or, for a producer started
   without ``--dataset``, none (``dataset.spec`` is ``""``, ``len`` 0, ``fingerprint`` ``""``);
2. a consumer that names a spec other than the one announced (:func:`answer_hello` says ``NAME``) answers with a
   WELCOME that carries ``dataset`` and does not register the producer: no TASK goes to it yet;
3. the producer opens that dataset (one opened dataset per distinct spec and arguments, :func:`dataset_key`),
   binds the connection to it, stays GREETING and says HELLO again at once, same nonce, announcing it with
   ``args`` echoed (``dataset.args``): the consumer learns its length and fingerprint from this HELLO, as from any,
   admits it and WELCOMEs it without ``dataset``; the producer serves;
4. a producer that may not or cannot load it says HELLO with ``refused`` (why, naming its allow-list): the consumer
   answers a permanent REJECT with that reason and logs it as an error.

A consumer whose spec is the producer's own ``--dataset`` is admitted as before (its ``dataset_args`` are not
compared: only the fingerprint tells datasets apart); a consumer that names no spec is admitted to a producer's own
dataset as before, and rejected (permanently, saying why) by a producer that has none.
"""

from __future__ import annotations

import json
from typing import Any

from ferry.common.constants import MAX_TEXT

__all__ = ["ADMIT", "NAME", "REJECT", "answer_hello", "dataset_key", "named_dataset", "valid_named", "MAX_WEIGHT",
           "valid_weight"]

ADMIT, NAME, REJECT = "admit", "name", "reject"

#: The largest share weight a consumer may ask for (``RemoteLoader(weight=)``, WELCOME ``weight``); the smallest is
#: above 0. A bound, so that one job cannot make every other's virtual time stand still.
MAX_WEIGHT = 1000.0


def valid_weight(value: Any) -> bool:
    """A WELCOME's ``weight``: a number in (0, MAX_WEIGHT]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_WEIGHT


def dataset_key(spec: str, args: dict[str, Any] | None) -> str:
    """One string per distinct (spec, arguments): what a producer keeps one opened dataset for."""
    return spec + "?" + json.dumps(args or {}, sort_keys=True, separators=(",", ":"))


def named_dataset(spec: str, args: dict[str, Any] | None) -> dict[str, Any]:
    """The WELCOME's ``dataset`` field naming ``spec`` with ``args``."""
    return {"spec": spec, "args": dict(args or {})}


def valid_named(value: Any) -> bool:
    """A WELCOME's ``dataset``: ``{spec: non-empty str, args: {str: JSON value}}``, within MAX_TEXT as JSON."""
    if not (isinstance(value, dict) and set(value) == {"spec", "args"} and isinstance(value["spec"], str)
            and 0 < len(value["spec"]) <= MAX_TEXT and isinstance(value["args"], dict)
            and all(isinstance(k, str) for k in value["args"])):
        return False
    try:
        return len(json.dumps(value["args"])) <= MAX_TEXT
    except (TypeError, ValueError):  # bytes, or a value JSON has no form for
        return False


def answer_hello(hello: dict[str, Any], spec: str | None, args: dict[str, Any] | None) -> tuple[str, str]:
    """What a consumer that names ``spec`` (None: it names none) with ``args`` answers to ``hello``.

    Returns ``(ADMIT, "")`` (check the dataset and register as before), ``(NAME, "")`` (WELCOME naming
    ``spec``, do not register) or ``(REJECT, reason)`` (a permanent REJECT).
    """
    announced = hello["dataset"]
    if "refused" in hello:
        return REJECT, f"the consumer was given dataset={spec!r}, which this producer cannot serve: {hello['refused']}"
    if spec is None:
        if announced["spec"] == "":
            return REJECT, ("this producer serves no dataset of its own (it was started without --dataset): name one "
                            "with RemoteLoader(dataset='SPEC', dataset_args={...})")
        return ADMIT, ""
    echoed = announced.get("args")
    if announced["spec"] == spec and (echoed is None or echoed == dict(args or {})):
        return ADMIT, ""  # its own --dataset (args not compared, as before), or the very dataset we named
    if hello.get("pool") is True:
        return NAME, ""
    return REJECT, f"this producer serves dataset {announced['spec']!r}, but the consumer was given dataset={spec!r}"
