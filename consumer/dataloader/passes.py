"""One pass of a :class:`ferry.DataLoader`: its batches drawn from torch's own samplers, as DataLoader draws them.

Each ``iter()`` of a DataLoader draws, in this order: its workers' base seed, one int64 from its ``generator`` (torch's
global generator without one; only at the first ``iter()`` with ``persistent_workers=True``), then its batch
sampler's order (a ``RandomSampler`` without a generator draws one more int64 from the global generator and
permutes from it; ``DistributedSampler`` permutes from ``seed + epoch``; a sampler of the user's own does what it
does). :func:`draw_pass` makes exactly those draws, from the very sampler objects the loader holds (the ones
torch's ``DataLoader.__init__`` built, or the user's, or a framework's: Lightning's ``DistributedSampler``,
Accelerate's ``BatchSamplerShard``), so the pass's batches are DataLoader's, and lays them out as an
:class:`~ferry.common.plan.EpochPlan` that local producers, remote producers or the calling process load.

Resume. Whatever the pass drew from a generator is kept (:class:`Pass`): the state of each generator the sampler
drew from, taken just before its draws, and after them. :func:`replay_pass` draws the same batches again in a
new process from those states, then leaves the trainer's global generator as it found it (the trainer's own: a
checkpoint restores it, as with DataLoader) and sets every other generator (the loader's ``generator``, a
sampler's own) to where the pass left it, so the passes after the resumed one draw what they drew before. A
digest of the pass's indices is kept too: a sampler that gives other batches on replay (another epoch given to a
``DistributedSampler``, another rank) is a :class:`~ferry.common.errors.ConfigError`, not a silently other order.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler

from ferry.common.errors import ConfigError
from ferry.common.plan import EpochPlan

__all__ = ["Pass", "draw_pass", "replay_pass", "draw_base_seed", "pass_state", "GLOBAL"]

#: The name of torch's global (default) CPU generator among a pass's generators.
GLOBAL = "torch"
#: How deep :func:`_generators` looks for samplers' generators (a BatchSamplerShard's batch sampler's sampler).
_DEPTH = 4


@dataclass
class Pass:
    """One pass's batches and what it drew.

    Attributes:
        number: the pass, from 0 (the loader's ``iter()`` calls that drew a pass): the epoch its producers see.
        plan: the pass's batches (an unbatched plan's items), in DataLoader's order.
        before: each generator the sampler drew from (``GLOBAL`` or its attribute path), its state just before.
        after: the same generators' states after the sampler's draws.
        digest: a digest of the plan's indices, to check a replay against.
    """

    number: int
    plan: EpochPlan
    before: dict[str, torch.Tensor] = field(default_factory=dict)
    after: dict[str, torch.Tensor] = field(default_factory=dict)
    digest: str = ""


def draw_base_seed(generator: torch.Generator | None) -> int:
    """DataLoader's first draw of an iteration (its workers' ``_base_seed``), from ``generator`` or the global one."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _generators(loader: Any) -> dict[str, torch.Generator]:
    """The generators a pass may draw from: the global one (or the loader's ``generator``), and each
    ``torch.Generator`` a sampler of the loader holds (``sampler.generator``, ``batch_sampler.sampler.generator``…)."""
    found: dict[str, torch.Generator] = {}
    if loader.generator is None:
        found[GLOBAL] = torch.default_generator
    else:
        found["generator"] = loader.generator
    seen: set[int] = {id(g) for g in found.values()}

    def visit(obj: Any, path: str, depth: int) -> None:
        if obj is None or depth > _DEPTH:
            return
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator) and id(generator) not in seen and generator.device.type == "cpu":
            seen.add(id(generator))
            found[f"{path}.generator"] = generator
        for name in ("sampler", "batch_sampler"):
            inner = getattr(obj, name, None)
            if inner is not None and inner is not obj:
                visit(inner, f"{path}.{name}", depth + 1)

    visit(loader.sampler, "sampler", 0)
    visit(loader.batch_sampler, "batch_sampler", 0)
    return found


def _plan(loader: Any, number: int) -> EpochPlan:
    """The pass's batches, drawn from the loader's batch sampler (its sampler's items, unbatched)."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:  # unbatched: each item of the sampler is one dataset[item]
        return EpochPlan.unbatched_items(number, loader.sampler)
    if type(batch_sampler) is BatchSampler:  # torch's own: consecutive runs of its sampler, read once, in numpy
        items = list(batch_sampler.sampler)
        try:
            indices = np.array(items, dtype=np.int64)  # ints: about 0.1 s for ImageNet's 1.28 M (int() each: 0.4 s)
        except (TypeError, ValueError):
            indices = np.fromiter((int(i) for i in items), dtype=np.int64, count=len(items))
        if indices.ndim != 1:  # a sampler of lists is a batch sampler's job: read it as DataLoader's BatchSampler does
            return EpochPlan.from_batches(number, batch_sampler)
        return EpochPlan.from_indices(number, indices, batch_sampler.batch_size, batch_sampler.drop_last)
    return EpochPlan.from_batches(number, batch_sampler)


def _digest(plan: EpochPlan) -> str:
    return hashlib.blake2b(plan._flat.tobytes() + plan._starts.tobytes() + str(plan.unbatched).encode(),
                           digest_size=12).hexdigest()


def draw_pass(loader: Any, number: int) -> Pass:
    """Pass ``number``'s batches, drawn now from the loader's samplers as DataLoader draws them (the base seed is
    the caller's: :func:`draw_base_seed`)."""
    generators = _generators(loader)
    before = {name: g.get_state() for name, g in generators.items()}
    plan = _plan(loader, number)
    after = {name: g.get_state() for name, g in generators.items()}
    drew = [name for name in generators if not torch.equal(before[name], after[name])]
    return Pass(number, plan, {n: before[n] for n in drew}, {n: after[n] for n in drew}, _digest(plan))


def replay_pass(loader: Any, saved: dict[str, Any]) -> Pass:
    """The pass a :func:`pass_state` describes, drawn again from the states it kept.

    Raises:
        ConfigError: the samplers give other batches than when the state was saved, or a generator the state
            names is not the loader's.
    """
    number = int(saved["pass"])
    generators = _generators(loader)
    before = {name: _tensor(value) for name, value in saved.get("before", {}).items()}
    after = {name: _tensor(value) for name, value in saved.get("after", {}).items()}
    missing = sorted(set(before) - set(generators))
    if missing:
        raise ConfigError(f"the loader state was saved by a loader whose sampler drew from {missing[0]}, which this "
                          f"loader has not: resume with the same sampler and generator, or start a new pass")
    global_state = torch.default_generator.get_state()
    for name, state in before.items():
        generators[name].set_state(state)
    try:
        plan = _plan(loader, number)
    finally:
        torch.default_generator.set_state(global_state)  # the trainer's: as it was
        for name, state in after.items():  # the loader's and the samplers' own: where the pass left them
            if name != GLOBAL:
                generators[name].set_state(state)
    if _digest(plan) != saved.get("digest"):
        raise ConfigError(f"the loader state's pass {number} drew other batches than the samplers give now (a "
                          f"DistributedSampler given another epoch or rank, another dataset length, another "
                          f"batch size?): resume with the samplers in the state they had when it was saved (call "
                          f"sampler.set_epoch(e) before iter() as the saving run did), or start a new pass")
    return Pass(number, plan, before, after, saved["digest"])


def pass_state(current: Pass) -> dict[str, Any]:
    """What :func:`replay_pass` needs, JSON-serialisable (a generator's state, about 5 KB, in base64)."""
    return {"pass": current.number, "digest": current.digest,
            "before": {name: _text(state) for name, state in current.before.items()},
            "after": {name: _text(state) for name, state in current.after.items()}}


def _text(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _tensor(text: Any) -> torch.Tensor:
    if not isinstance(text, str):
        raise ConfigError(f"a loader state's generator state must be a base64 string, got {type(text).__name__}")
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
