"""Ferry's consumer: :class:`RemoteLoader`, the iterator inside the training script.

See :mod:`ferry.consumer.loader` for its lifecycle, threads and shutdown order.
"""

from ferry.common.errors import NoProducersError, RemoteSampleError

from ferry.consumer.loader import RemoteLoader

__all__ = ["RemoteLoader", "RemoteSampleError", "NoProducersError"]
