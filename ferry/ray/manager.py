"""RayProducers: Ferry's producers as Ray actors, for one loader (docs/deployment.md#ray).

Lifecycle::

    RayProducers(loader, ...)   check the options; take the endpoint, keys and dataset from the loader (or the
                                keywords); start the watch thread, which starts the first actors
    (training)                  the watch thread follows the actors (deaths told to the loader at once, actors dead
                                for good replaced) and, under producers="auto", the loader's demand
    producers.close()           (also ``with``, or at the driver's exit) every actor stopped (BYE, drain), then
                                killed; the key it authorized removed

The decisions live in :mod:`ferry.ray.fleet`, the Ray calls in :mod:`ferry.ray.crew`, what is taken from the loader
in :mod:`ferry.ray.handover`, the actor in :mod:`ferry.ray.actor`.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from ferry.common import validate as check
from ferry.common.errors import ConfigError, ProducerExitError
from ferry.consumer.local.autoscale import ScalePolicy
from ferry.producer import ProducerConfig

from ferry.ray.actor import ProducerActor
from ferry.ray.crew import Crew
from ferry.ray.fleet import Fleet
from ferry.ray.handover import Handover, file_keys, loader_keys, reachable_endpoint

__all__ = ["RayProducers", "AUTO"]

log = logging.getLogger("ferry.ray")

AUTO = "auto"
#: Calls each actor answers at once: serve() holds one; where(), stop() and figures() take the others.
ACTOR_CONCURRENCY = 4
#: How long stopped actors may take beyond their drain timeout before they are killed. [Unit: second]
STOP_GRACE_S = 5.0


class RayProducers:
    """Ferry producers as Ray actors, serving ``loader`` (or, from a separate driver, the loader at ``endpoint``).

    Call ``ray.init(...)`` first. With a loader, everything the producers need comes from it: its endpoint, its
    CURVE keys (a key pair made here is authorized in its folder; or ``curve_key``), its dataset (a spec with its
    arguments, or the object itself, which Ray pickles to the actors), and deaths and demand (its
    ``producer_gone`` and ``stats()["producers_needed"]``). Without one (another process), give ``endpoint``,
    ``dataset`` and, with CURVE, ``curve_key`` and ``curve_server_key``; the demand then comes from what the
    producers hear in their consumer's PINGs, and a dead actor's tasks wait out the loader's liveness window.

    Args:
        loader: the :class:`~ferry.RemoteLoader` to serve, in this process; None from a separate driver.
        producers: how many actors, or ``"auto"``: as many as the loader's demand gauge asks for, between
            ``producers_min`` (default 1) and ``producers_max`` (default the cluster's CPUs over ``cpus``), with the
            damping of ``local_producers="auto"`` (one change per 5 s, a change of direction at most once a minute).
        producers_min, producers_max: the bounds under ``"auto"``.
        endpoint: where the producers connect; by default the loader's first ``tcp://`` endpoint (``tcp://*:P``
            at the address Ray knows this node by). A loader bound to loopback is reached from this node only:
            the actors then run here.
        dataset, dataset_args: what they serve; by default the loader's (``dataset=``, ``dataset_args=``).
        curve_key: a producer key pair (``.key_secret``) authorized by the loader; with a loader, by default a
            pair made here and authorized for as long as the actors run.
        curve_server_key: the loader's public key file (separate driver only; a loader's is read from it).
        cpus: Ray CPUs each actor reserves (its ``num_cpus``).
        producer_options: more :class:`~ferry.producer.ProducerConfig` fields (``threads``, ``slots``,
            ``transform``, ``exit_when_stuck`` ...).
        actor_options: more Ray actor options (``scheduling_strategy``, which is ``"SPREAD"`` by default,
            ``runtime_env``, ``resources``, ``memory`` ...).
        max_restarts: Ray's restarts of an actor whose process died of a failure a restart may cure (exit status 1,
            4 or 5); one that failed its configuration, or was rejected by its consumers, is never restarted.

    Raises:
        MissingExtraError: Ray is not installed (``pip install 'ferry[ray]'``).
        ConfigError: Ray is not initialized; an invalid option; no endpoint or dataset; keys that do not load.
    """

    def __init__(self, loader: Any = None, *, producers: int | str = 1, producers_min: int | None = None,
                 producers_max: int | None = None, endpoint: str | None = None, dataset: Any = None,
                 dataset_args: dict[str, Any] | None = None, curve_key: str | None = None,
                 curve_server_key: str | None = None, cpus: float = 1.0,
                 producer_options: dict[str, Any] | None = None, actor_options: dict[str, Any] | None = None,
                 max_restarts: int = 3) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise ConfigError("ferry.ray: call ray.init() first (ray.init(address=...) for a cluster; Ray 2.60 needs "
                              "RAY_AUTH_MODE=token in the environment before `import ray` to join one that uses "
                              "tokens: docs/deployment.md#ray)")
        cpus = check.number("cpus", cpus, low=0)
        max_restarts = check.integer("max_restarts", max_restarts, low=-1)
        low, high, policy = _bounds(producers, producers_min, producers_max, cpus, ray)
        handover = _handover(loader, endpoint, curve_key, curve_server_key, ray)
        try:
            config, dataset_object = _config(loader, handover, dataset, dataset_args, producer_options)
            actor_class = ray.remote(ProducerActor).options(**{
                "num_cpus": cpus, "max_restarts": max_restarts, "max_task_retries": 0,
                "max_concurrency": ACTOR_CONCURRENCY, "scheduling_strategy": _placement(handover, ray),
                **(actor_options or {})})
            dataset_ref = ray.put(dataset_object) if dataset_object is not None else None
        except BaseException:
            handover.close()
            raise
        self.endpoint, self.low, self.high, self.auto = handover.endpoint, low, high, policy is not None
        self._crew = Crew(
            Fleet(low, high, policy=policy),
            make_actor=lambda place: actor_class.remote(config, dataset_ref),
            handover=handover, gone=loader.producer_gone if loader is not None else None,
            needed=_gauge(loader) if loader is not None else None,
            stop_timeout=config.drain_timeout + STOP_GRACE_S, keep=dataset_ref)
        self._closed = False
        self._crew.start()
        self._finalizer = weakref.finalize(self, self._crew.close, config.drain_timeout + 2 * STOP_GRACE_S)
        log.info("ferry.ray: %s producer actors (%s) for %s", f"{low}..{high}" if self.auto else low,
                 config.dataset_label or "the loader's dataset", handover.endpoint)

    # --- the count -----------------------------------------------------------------------------------------
    def scale_to(self, count: int) -> None:
        """Run ``count`` actors (within the bounds; under ``"auto"`` the demand moves it again)."""
        count = check.integer("count", count, low=self.low, high=self.high)
        self._check()
        self._crew.command(lambda now: self._crew.fleet.scale_to(count, now))

    def wait_serving(self, count: int | None = None, timeout: float = 120.0) -> list[str]:
        """Wait until ``count`` actors (default: as many as wanted now) serve; returns their producers' names.

        Raises:
            ProducerExitError: an actor failed in a way a restart repeats (its configuration, a rejection).
            TimeoutError: not within ``timeout`` seconds [Unit: second]; the message says what runs.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._check()
            stats = self.stats()
            wanted = count if count is not None else stats["target"]
            if stats["serving"] >= wanted:
                return [p["name"] for p in stats["actors"] if p["state"] == "serving"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"ferry.ray: {stats['serving']} of {wanted} producer actors serve after "
                                   f"{timeout:g} s: {self!r}")
            time.sleep(0.05)

    def stats(self) -> dict[str, Any]:
        """``target`` (the count wanted), ``serving``, ``failure`` (why starting stopped, else ""), and ``actors``:
        each one's ``place``, ``state``, ``name`` (``host:pid``) and ``node``."""
        fleet = self._crew.fleet
        with self._crew.lock:
            actors = [{"place": m.place, "state": m.state, "name": m.name, "node": m.node}
                      for m in sorted(fleet.members.values(), key=lambda m: m.place)]
            return {"target": fleet.target, "serving": len(fleet.serving), "failure": fleet.failure,
                    "actors": actors}

    def actors(self) -> dict[str, Any]:
        """The serving actors' handles, by their producer's name (``host:pid``): for a script's own calls to them
        (``figures()``), or to kill one on purpose (``ray.kill``: the manager tells the loader and replaces it)."""
        handles = self._crew.handles()
        with self._crew.lock:
            names = {m.place: m.name for m in self._crew.fleet.serving}
        return {names[place]: handle for place, handle in handles.items() if place in names}

    # --- lifecycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every actor (BYE, drain), kill it, remove the authorized key. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "RayProducers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self) -> None:
        if self._crew.failure is not None:
            raise ConfigError(f"ferry.ray: the watch thread failed: {self._crew.failure!r}") from self._crew.failure
        fleet = self._crew.fleet
        if fleet.failure:
            raise ProducerExitError(f"ferry.ray: a producer actor failed, and no more are started: {fleet.failure}",
                                    fleet.failure_status)

    def __repr__(self) -> str:
        with self._crew.lock:
            return f"<RayProducers {self._crew.fleet!r} -> {self.endpoint}{' [closed]' if self._closed else ''}>"


# --- options -------------------------------------------------------------------------------------------------
def _ray() -> Any:
    try:
        import ray
    except ImportError:
        from ferry.common.errors import MissingExtraError

        raise MissingExtraError("ferry.ray needs Ray: pip install 'ferry[ray]'") from None
    return ray


def _bounds(producers: Any, low: Any, high: Any, cpus: float, ray: Any) -> tuple[int, int, ScalePolicy | None]:
    if producers == AUTO:
        low = 1 if low is None else check.integer("producers_min", low, low=1)
        if high is None:
            cluster = ray.cluster_resources().get("CPU", 1.0)
            high = max(low, int(cluster // cpus) if cpus else low)
        high = check.integer("producers_max", high, low=low)
        return low, high, ScalePolicy(low, high)
    count = check.integer("producers", producers, low=1)
    if low is not None or high is not None:
        raise ConfigError("producers_min and producers_max go with producers='auto'")
    return count, count, None


def _handover(loader: Any, endpoint: str | None, curve_key: str | None, curve_server_key: str | None,
              ray: Any) -> Handover:
    node = ray.util.get_node_ip_address()
    if endpoint is None and loader is None:
        raise ConfigError("ferry.ray without a loader needs endpoint='tcp://TRAINER:PORT'")
    target, local_only = reachable_endpoint([endpoint] if endpoint is not None else list(loader.endpoints), node)
    if loader is not None and loader.curve is not None:
        client, authorized = loader_keys(loader.curve, curve_key)
        return Handover(target, local_only, client, authorized)
    if curve_key or curve_server_key:
        if loader is not None:
            raise ConfigError("curve_key is for a loader with CURVE keys (curve=CurveOptions(...)); this one has none")
        if not (curve_key and curve_server_key):
            raise ConfigError("a separate driver needs both curve_key and curve_server_key (the loader's public key)")
        return Handover(target, local_only, file_keys(curve_key, curve_server_key))
    return Handover(target, local_only)


def _config(loader: Any, handover: Handover, dataset: Any, dataset_args: dict[str, Any] | None,
            options: dict[str, Any] | None) -> tuple[ProducerConfig, Any]:
    """The producers' configuration, and the dataset object to hand them (None: a spec)."""
    if dataset is None and loader is not None:
        dataset, dataset_args = loader.dataset, dataset_args if dataset_args is not None else loader.dataset_args
    if dataset is None:
        raise ConfigError("ferry.ray: no dataset to serve: give dataset= (a spec or an object), or a loader built "
                          "with one")
    spec = dataset if isinstance(dataset, str) else ""
    label = spec or f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    config = ProducerConfig(endpoints=(handover.endpoint,), dataset=spec, dataset_args=dict(dataset_args or {}),
                            dataset_label=label, curve=handover.curve, **(options or {}))
    return config, None if spec else dataset


def _placement(handover: Handover, ray: Any) -> Any:
    """SPREAD over the nodes; on this node only for a loader bound to loopback (said once if others exist)."""
    if not handover.local_only:
        return "SPREAD"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if sum(node.get("Alive", False) for node in ray.nodes()) > 1:
        log.warning("ferry.ray: the loader is bound to loopback (%s): no other node can reach it, so every producer "
                    "actor runs on this node. Bind an address the nodes reach (with CURVE keys) to spread them",
                    handover.endpoint)
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _gauge(loader: Any) -> Any:
    def needed() -> int | None:
        try:
            return loader.stats()["producers_needed"]
        except Exception:  # a closed loader: nothing to follow
            return None
    return needed
