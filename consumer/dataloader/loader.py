"""``ferry.DataLoader``: torch's ``DataLoader``, whose batches Ferry's producers load. Porting is one import.

Lifecycle::

    DataLoader(dataset, ...)   torch's DataLoader.__init__ (its checks, its attributes, its samplers), then
                               Ferry's own options checked; nothing starts (frameworks build loaders they never
                               iterate: Lightning re-instantiates one with a DistributedSampler)
    iter(loader)               a pass, drawn as DataLoader draws it (consumer/dataloader/passes.py); the first
                               iter() takes the dataset: it starts the engine, a RemoteLoader with the
                               producers (num_workers=N local ones, remote ones at an endpoint), kept for the
                               loader's life; with num_workers=0 and no endpoint, the pass loads right here
                               (consumer/dataloader/inprocess.py)
    loader.close()             (also ``with``; else when the loader and its iterators are dropped, or at exit:
                               the engine's own finalizer)

What each DataLoader option becomes: consumer/dataloader/engine.py and docs/porting.md.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.utils.data

from ferry.common.constants import DEFAULT_LOG_EVERY_S
from ferry.common.errors import ConfigError, LoaderClosedError

from ferry.consumer.dataloader.engine import OWN_KEYWORDS, engine_keywords, loads_in_process
from ferry.consumer.dataloader.inprocess import InProcessPass, IterablePass
from ferry.consumer.dataloader.passes import Pass, draw_base_seed, draw_pass, pass_state, replay_pass
from ferry.consumer.options import UNSET, CurveOptions, LocalOptions, TransportOptions, resolve_options
from ferry.consumer.planning import GivenPlans

__all__ = ["DataLoader"]

_SEED_MASK = (1 << 63) - 1
#: state_dict()'s ``kind``: a state of this class, not of RemoteLoader (whose state it holds as ``engine``)
STATE_KIND = "ferry.DataLoader"


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` with Ferry's producers: the same signature (every argument and default of
    the installed torch), the same batches and attributes, and Ferry's own options as extra keyword-only arguments
    (RemoteLoader's: docs/porting.md). A subclass of torch's DataLoader, so that frameworks take it.

    Each ``iter()`` draws a pass as DataLoader does (its workers' base seed, then its samplers, from torch's global
    generator or ``generator``); its batches are loaded by ``num_workers`` local producers, by remote producers at
    ``endpoint``, or with ``num_workers=0`` (and no endpoint) in the calling process. A map-style sample is loaded
    under generators seeded from ``(seed, pass, index)`` wherever it loads (``seed``: DataLoader's first base seed
    unless given), so its random augmentations are the same with any number of producers, after a kill, a resume.
    Producers start at the first ``iter()`` and live until ``close()`` (``persistent_workers`` or not).

    Extras: ``state_dict()`` / ``load_state_dict()`` (resume mid-pass, in a new process), ``stats()``,
    ``close()``. Ferry's own options are checked when the loader is built; nothing starts then.

    Raises:
        ValueError, TypeError: DataLoader's own (from torch's ``DataLoader.__init__``).
        ConfigError: one of Ferry's options is invalid (a ValueError; ConfigTypeError, a wrong type, is a TypeError).
    """

    def __init__(
        self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
        batch_sampler: Any = None, num_workers: int = 0, collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None, multiprocessing_context: Any = None,
        generator: torch.Generator | None = None, *,
        prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
        in_order: bool = True,
        # Ferry's own (RemoteLoader's; buffer_batches not given: prefetch_factor x num_workers if that is given)
        endpoint: str | list[str] | None | Any = UNSET, seed: int = UNSET, buffer_batches: int = UNSET,
        no_producer_timeout: float | None = UNSET, dataset_args: dict[str, Any] | None = None,
        dataset_len: int | None = None, iterable_streams: int | None = None,
        device: str | torch.device | None = None, device_transform: Callable[[Any], Any] | None = None,
        on_error: str = "raise", log_every: float | None = DEFAULT_LOG_EVERY_S, metrics_port: int | None = None,
        local: LocalOptions | None = None, transport: TransportOptions | None = None,
        curve: CurveOptions | None = None,
        producer_threads: int = UNSET, producer_slots: int = UNSET, producer_transform: Any = UNSET,
        shared_memory: bool = UNSET, collate_args: dict[str, Any] | None = UNSET,
        producer_transform_args: dict[str, Any] | None = UNSET, producer_ahead: int | None = UNSET,
        seed_per_sample: bool | None = UNSET, heartbeat: float = UNSET, liveness: int = UNSET,
        task_timeout: float = UNSET, max_batch_bytes: int = UNSET, max_attempts: int = UNSET,
        compression: str | None = UNSET, weight: float = UNSET, curve_secret_key: str | None = UNSET,
        curve_authorized_keys: str | None = UNSET,
    ) -> None:
        given = locals()
        defaults = _FERRY_DEFAULTS
        if isinstance(dataset, str):
            raise ConfigError(f"ferry.DataLoader takes a dataset object, as DataLoader does, not a spec string "
                              f"({dataset!r}): a spec is RemoteLoader's (RemoteLoader(dataset={dataset!r}, ...))")
        # given Ferry options are instance attributes of their keyword's name: Lightning re-instantiates a loader from
        # its attributes (those that differ from the signature's defaults); the others read the class's defaults
        ferry = {name: given[name] for name in OWN_KEYWORDS if given[name] is not defaults[name]}
        # by keyword: a framework that records the arguments of torch's __init__ (Lightning) must not see a sampler
        # passed positionally here and again by keyword when it re-instantiates the loader with its own
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                         num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                         timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                         generator=generator, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        # written to __dict__, not through setattr: a framework that records the attributes set after torch's
        # __init__ to set them again on the loader it re-instantiates (Lightning) must not copy this one's state
        self.__dict__.update(ferry)
        self.__dict__.update(
            _ferry=ferry, _prefetch_given=prefetch_factor is not None, _plans=GivenPlans(),
            _engine=None,  # the RemoteLoader, from the first iter() that needs producers
            _closed=False,
            _seed=None,  # the per-sample seeds' base: `seed`, else the first pass's base seed
            _next_pass=0,
            _current=None,  # the newest pass (a Pass; None for an iterable dataset)
            _in_process=None,  # its iterator, when this process loads it
            _resume=None,  # a state load_state_dict gave, for the next iter()
        )
        saved = self.__dict__.get("__pl_saved_kwargs")
        if isinstance(saved, dict):  # Lightning recorded torch's __init__ call, not this one (its hook began before
            for name, value in ferry.items():  # ferry.DataLoader was imported): the re-instantiation keeps Ferry's
                saved.setdefault(name, value)
        self._check_ferry_options()

    @property
    def ferry_options(self) -> dict[str, Any]:
        """Ferry's own options as given (a copy)."""
        return dict(self._ferry)

    def _check_ferry_options(self) -> None:
        """Ferry's options, checked now as the engine will take them (nothing starts)."""
        seed = self._ferry.get("seed", 0)
        kwargs = engine_keywords(self, self._plans, seed, self._prefetch_given)
        if not loads_in_process(self):
            from ferry.consumer.loader import RemoteLoader
            import inspect

            names = inspect.signature(RemoteLoader.__init__).parameters
            resolve_options({name: kwargs.get(name, p.default) for name, p in names.items()
                             if name not in ("self", "dataloader_options")})
        elif self.timeout:
            raise ConfigError(f"timeout={self.timeout} applies to producers: with num_workers=0 the calling process "
                              f"loads each batch itself (DataLoader refuses a timeout without workers too)")

    # --- Hugging Face Accelerate ----------------------------------------------------------------------
    @property
    def _is_accelerate_prepared(self) -> bool:
        """accelerate's question, read first in ``Accelerator.prepare_data_loader``: answered there by preparing
        this loader in place, accelerate's batches loaded by Ferry's producers (consumer/dataloader/accelerate.py)."""
        import sys

        from ferry.consumer.dataloader.accelerate import prepared_in_place

        return prepared_in_place(self, sys._getframe(1))

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:  # accelerate marks what it prepared
        self.__dict__["_accelerate_mark"] = bool(value)

    @property
    def _accelerated(self) -> Any:
        """accelerate's DataLoaderShard this loader iterates through once an accelerator prepared it, or None."""
        return self.__dict__.get("_accelerate_shard")

    def set_epoch(self, epoch: int) -> None:
        """Once an accelerator prepared this loader: accelerate's shard's ``set_epoch`` (its sampler's). Otherwise a
        pass is drawn at each iter() as DataLoader draws it: give the epoch to your sampler."""
        if self._accelerated is None:
            raise AttributeError("ferry.DataLoader has no set_epoch, as torch's DataLoader has none: call "
                                 "sampler.set_epoch(epoch) (a DistributedSampler's)")
        self._accelerated.set_epoch(epoch)

    def __len__(self) -> int:
        if self._accelerated is not None:  # this process's share of the batches, as accelerate counts them
            return len(self._accelerated)
        return super().__len__()

    # --- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> Any:
        """A new pass: drawn as DataLoader draws it (or the pass a loaded state was saved in, from its batch on)."""
        if self._accelerated is not None:  # accelerate's shard of the batches, loaded by a ferry.DataLoader of its own
            return iter(self._accelerated)
        if self._closed:
            raise LoaderClosedError("this DataLoader is closed")
        resume, self._resume = self._resume, None
        first = 0
        if resume is not None and resume.get("pass") is not None:  # an iterable dataset's stream is read again
            number = int(resume["pass"]["pass"])
            current = None if self._is_iterable() else replay_pass(self, resume["pass"])
            first = int(resume.get("batches_delivered", 0))
        else:
            if not self.persistent_workers or self._next_pass == 0 and self._seed is None:
                base_seed = draw_base_seed(self.generator)  # DataLoader's first draw of every iteration
                if self._seed is None:
                    self._seed = self._ferry.get("seed", base_seed) & _SEED_MASK
            number = self._next_pass
            current = None if self._is_iterable() else draw_pass(self, number)
            resume = None
        if self._seed is None:
            self._seed = self._ferry.get("seed", 0) & _SEED_MASK
        self._current, self._next_pass = current, number + 1
        if loads_in_process(self):
            self._in_process = self._in_process_pass(current, first)
            return self._in_process
        engine = self._engine_for()
        if current is not None:
            self._plans.give(current.plan)
        if resume is not None and resume.get("engine") is not None:
            engine.load_state_dict(resume["engine"])
        else:
            engine.set_epoch(number)
        return iter(engine)

    def _is_iterable(self) -> bool:
        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    def _in_process_pass(self, current: Pass | None, first: int) -> Any:
        pin = bool(self.pin_memory) and torch.cuda.is_available()
        if self.pin_memory and not pin:  # DataLoader's own warning, at the same moment (the engine warns likewise)
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                          "memory won't be used.", stacklevel=3)
        device = torch.device(self._ferry["device"]) if self._ferry.get("device") is not None else None
        transform = self._ferry.get("device_transform")
        if current is None:
            return IterablePass(self.dataset, batch_size=self.batch_size, drop_last=self.drop_last, first=first,
                                collate_fn=self.collate_fn, pin=pin, device=device, device_transform=transform)
        per_sample = self._ferry.get("seed_per_sample")
        return InProcessPass(self.dataset, current.plan, first=first, seed=self._seed,
                             seed_per_sample=per_sample is not False, collate_fn=self.collate_fn, pin=pin,
                             device=device, device_transform=transform)

    def _engine_for(self) -> Any:
        """The RemoteLoader that loads the passes: started at the first iter() (the dataset is taken then)."""
        if self._engine is None:
            from ferry.consumer.loader import RemoteLoader

            kwargs = engine_keywords(self, self._plans, self._seed, self._prefetch_given)
            # RemoteLoader draws its local producers' base seed from torch's global generator (as DataLoader draws
            # its workers'): this loader made DataLoader's draws already, so that one leaves the trainer's stream as
            # it was (the producers' process seeds still follow it, and each sample has its own: passes.py)
            state = torch.default_generator.get_state()
            try:
                self._engine = RemoteLoader(**{k: v for k, v in kwargs.items() if v is not UNSET})
            finally:
                torch.default_generator.set_state(state)
        return self._engine

    # --- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is (once an accelerator prepared it, where the ferry.DataLoader inside accelerate's shard
        is): the pass being iterated (what it drew, to draw it again), the batches of it the loop
        got, and the per-sample seeds' base. Small and JSON-serialisable (a generator state a pass drew from is
        about 7 KB of text)."""
        if self._accelerated is not None:
            return self._accelerated.base_dataloader.state_dict()
        state: dict[str, Any] = {"kind": STATE_KIND, "seed": self._seed, "next_pass": self._next_pass}
        position = self._position()
        if position is not None:
            state.update(position)
        return state

    def _position(self) -> dict[str, Any] | None:
        """The current pass's state while it is not finished, else None (the next iter() draws a new pass)."""
        number = self._next_pass - 1
        if number < 0:
            return None
        if self._engine is not None and not loads_in_process(self):
            engine = self._engine.state_dict()
            if engine["epoch"] != number:  # the engine went past it: the pass is over
                return None
            delivered = engine["batches_delivered"]
        else:
            if self._in_process is None or self._in_process.finished:
                return None
            engine, delivered = None, self._in_process.delivered
        return {"pass": pass_state(self._current) if self._current is not None else {"pass": number},
                "batches_delivered": delivered, "engine": engine}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` yields the saved pass's batches from where the loop left it (the same batches,
        drawn again from the generator states the pass kept), then passes go on as before. Restore torch's global
        generator from your checkpoint for the passes after it to draw as the first run did, as with DataLoader.

        Raises:
            ConfigError: not a ferry.DataLoader's state, or its per-sample seed differs from this loader's own.
        """
        if self._accelerated is not None:
            self._accelerated.base_dataloader.load_state_dict(state)
            return
        if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
            raise ConfigError("load_state_dict takes what ferry.DataLoader.state_dict() returned (a RemoteLoader's "
                              "state is RemoteLoader's own)")
        seed = state.get("seed")
        given = self._ferry.get("seed")
        if seed is not None and given is not None and given & _SEED_MASK != seed:
            raise ConfigError(f"the state was saved with seed={seed}, this loader has seed={given}: resume with the "
                              f"same seed, or without seed= (the state's is taken)")
        if seed is not None and self._engine is not None and seed != self._seed:
            self._engine.close()  # its producers seed samples from the old seed: the next iter() starts anew
            self._engine = None
        self._seed = seed if seed is not None else self._seed
        self._next_pass = int(state.get("next_pass", 0))
        self._resume = dict(state) if state.get("pass") is not None else None

    # --- figures, lifecycle -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The engine's figures (RemoteLoader.stats()); before the first iter(), or loading in this process, only
        ``local_producers`` (0) and ``in_process``."""
        if self._accelerated is not None:
            return self._accelerated.base_dataloader.stats()
        if self._engine is not None:
            return {**self._engine.stats(), "in_process": False}
        return {"local_producers": 0, "in_process": loads_in_process(self)}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the producers and threads the loader started (none before the first iter()). Idempotent."""
        self._closed = True
        if self._engine is not None:
            self._engine.close()
        if self._accelerated is not None:
            self._accelerated.base_dataloader.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "closed" if self._closed else ("this process" if loads_in_process(self) else
                                               "producers" if self._engine is not None else "not started")
        return f"<ferry.DataLoader [{where}] num_workers={self.num_workers}>"


#: Ferry's options' defaults, read before a framework may wrap __init__ (Lightning does, for the length of a hook)
_FERRY_DEFAULTS = {name: DataLoader.__init__.__kwdefaults__[name] for name in OWN_KEYWORDS}
# Ferry's options not given read their signature's default (given ones are instance attributes: see __init__)
for _name, _default in _FERRY_DEFAULTS.items():
    setattr(DataLoader, _name, _default)
del _name, _default
