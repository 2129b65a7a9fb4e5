"""Ferry on Ray: producers as Ray actors that follow their loader's demand (docs/deployment.md#ray).

    import ray
    from ferry import RemoteLoader
    from ferry.ray import RayProducers

    ray.init(address="auto")
    loader = RemoteLoader(endpoint="tcp://*:5555", dataset="npy-folder", dataset_args={"root": "/data"},
                          batch_size=64, shuffle=True, curve=CurveOptions(...))
    with RayProducers(loader, producers="auto", producers_max=16):
        for batch in loader:
            ...

An optional extra (``pip install 'ferry[ray]'``): ``import ferry`` never imports Ray, this package does.
:class:`RayProducers` is the manager (:mod:`ferry.ray.manager`); :class:`ProducerActor` the actor it starts
(:mod:`ferry.ray.actor`), usable on its own.
"""

from __future__ import annotations

from ferry.ray.actor import ProducerActor
from ferry.ray.manager import AUTO, RayProducers

__all__ = ["RayProducers", "ProducerActor", "AUTO"]
