"""Every ``FERRY_*`` environment variable Ferry reads, and a warning for one it does not know.

A misspelled variable (``FERRY_THREAD=4`` for ``FERRY_THREADS``) would otherwise be silently ignored. Who reads
which variable:

* a producer: its settings' variables, :data:`ferry.producer.config.PRODUCER_ENV` (from the declarations of
  ``ProducerConfig`` and its command line). ``common`` imports neither side, so the caller passes them in;
* the loader (``RemoteLoader``): :data:`LOADER_VARIABLES` (:mod:`ferry.consumer.options.resolve` reads them by
  these names), and ``FERRY_LOG_LEVEL``, its local producers' level (one of the producer's);
* both: :data:`ferry.common.heap.ENV_VAR` (``FERRY_KEEP_FREED_MEMORY``);
* ``ferry demo`` (the engines' example trainer): :data:`DEMO_VARIABLES`;
* the shell scripts under ``deploy/`` and ``docker/``: :data:`SCRIPT_VARIABLES`;
* the test suite: :data:`TEST_VARIABLES`.

Every process may see all of them (an engine's file sets the trainer's and the producers' side by side; a loader's
local producers inherit the trainer's environment), so a variable is unknown only when none of them is it.
``tests/test_variables.py`` checks that every ``FERRY_*`` name in the source tree is one of them.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Iterable, Mapping

from ferry.common.heap import ENV_VAR as KEEP_FREED_MEMORY

__all__ = ["PREFIX", "LOADER_VARIABLES", "DEMO_VARIABLES", "SCRIPT_VARIABLES", "TEST_VARIABLES", "OTHER_VARIABLES",
           "ENDPOINT_VARIABLE", "CURVE_VARIABLES", "KEEP_FREED_MEMORY", "unknown_variables", "warn_unknown_variables"]

PREFIX = "FERRY_"

#: The loader's bind addresses, comma-separated, when the script gives none (an engine's file sets it).
ENDPOINT_VARIABLE = "FERRY_ENDPOINT"
#: The variables an engine's files set to turn CURVE on in the loader (docs/deployment.md), by flat keyword.
CURVE_VARIABLES = {"curve_secret_key": "FERRY_CURVE_SECRET_KEY", "curve_authorized_keys": "FERRY_CURVE_AUTHORIZED_KEYS"}
#: What the loader reads besides the producer's variables.
LOADER_VARIABLES: frozenset[str] = frozenset({ENDPOINT_VARIABLE, *CURVE_VARIABLES.values(), KEEP_FREED_MEMORY})
#: ``ferry demo``'s flags' variables (ferry/demo.py).
DEMO_VARIABLES: frozenset[str] = frozenset({
    "FERRY_SAMPLES", "FERRY_SIZE", "FERRY_BATCH_SIZE", "FERRY_PRODUCERS", "FERRY_ENDPOINT", "FERRY_MIN_PRODUCERS",
    "FERRY_EPOCHS", "FERRY_DATA_DIR", "FERRY_TIMEOUT", "FERRY_METRICS_PORT"})
#: The deployment scripts' own (deploy/slurm, deploy/kubernetes, deploy/swarm, docker/), which their jobs and
#: containers may pass on to a trainer or a producer.
SCRIPT_VARIABLES: frozenset[str] = frozenset({
    "FERRY_BASE_IMAGE", "FERRY_TRAINER_IMAGE", "FERRY_PRODUCER_IMAGE", "FERRY_KEYS_DIR", "FERRY_KEYS_COMMAND",
    "FERRY_SLURM_DIR", "FERRY_WATCH_S", "FERRY_PYTHON", "FERRY_PORT", "FERRY_TRAINER_RANKS", "FERRY_TRAINER_ADDRESS",
    "FERRY_DEBIAN_MIRROR", "FERRY_APT_DIR", "FERRY_E2E_DIR", "FERRY_SWARM_E2E_DIR"})
#: The test suite's (seeds to replay a run, a soak's length).
TEST_VARIABLES: frozenset[str] = frozenset({
    "FERRY_TEST_SEED", "FERRY_FUZZ_SEED", "FERRY_SOAK_SECONDS", "FERRY_SOAK_SHORT_SECONDS"})
#: Every variable some part of Ferry reads, but the producer's settings (the caller's ``own``).
OTHER_VARIABLES: frozenset[str] = LOADER_VARIABLES | DEMO_VARIABLES | SCRIPT_VARIABLES | TEST_VARIABLES

_warned: set[str] = set()  # the names this process warned about already (a second loader does not repeat them)

#: What Kubernetes injects into every pod for each Service in its namespace (for a ``ferry-metrics`` Service the
#: prefix and METRICS_SERVICE_HOST, METRICS_PORT_9100_TCP_ADDR, ...): not settings, never warned about.
_SERVICE_LINK = re.compile(r"_SERVICE_(HOST|PORT)(_[A-Z0-9_]+)?$|_PORT(_\d+_(TCP|UDP|SCTP)(_ADDR|_PORT|_PROTO)?)?$")


def unknown_variables(environ: Mapping[str, str], side: str, own: Iterable[str],
                      others: Iterable[str] = OTHER_VARIABLES) -> list[tuple[str, str]]:
    """The variables of ``environ`` named like Ferry's (``FERRY_``, in any case) that neither ``own`` (what
    ``side``, "producer" or "loader", reads) nor ``others`` (the rest of Ferry's) is, each with its warning, in name
    order: ``FERRY_THREAD is not a Ferry setting (did you mean FERRY_THREADS?); ignored``. The guess is the closest
    of ``own`` (difflib, on the part after ``FERRY_``), else the closest of ``others``, said not to be ``side``'s."""
    own, others = set(own), set(others) - set(own)
    found = []
    for name in sorted(environ):
        if not name.upper().startswith(PREFIX) or name in own or name in others or _SERVICE_LINK.search(name):
            continue
        guess = _closest(name, own)
        if guess:
            hint = f" (did you mean {guess}?)"
        else:
            guess = _closest(name, others)
            hint = f" (did you mean {guess}? the {side} does not read it)" if guess else ""
        found.append((name, f"{name} is not a Ferry setting{hint}; ignored"))
    return found


def _closest(name: str, candidates: set[str]) -> str:
    """The candidate most like ``name`` after the prefix (which every one shares), or "" when none is close."""
    by_rest = {candidate[len(PREFIX):]: candidate for candidate in candidates}
    match = difflib.get_close_matches(name[len(PREFIX):].upper(), sorted(by_rest), n=1, cutoff=0.7)
    return by_rest[match[0]] if match else ""


def warn_unknown_variables(log: logging.Logger, side: str, own: Iterable[str],
                           others: Iterable[str] = OTHER_VARIABLES,
                           environ: Mapping[str, str] | None = None) -> list[str]:
    """Log a WARNING on ``log`` for each variable of :func:`unknown_variables` (of ``environ``, by default this
    process's environment) not warned about before in this process. Returns the names it warned about."""
    found = unknown_variables(os.environ if environ is None else environ, side, own, others)
    fresh = [(name, text) for name, text in found if name not in _warned]
    for name, text in fresh:
        log.warning("%s", text)
        _warned.add(name)
    return [name for name, _ in fresh]
