"""Ferry's consumer: :class:`RemoteLoader`, the iterator inside the training script.

See :mod:`consumer.loader` for its lifecycle, threads and shutdown order.
"""

from common.errors import NoProducersError, RemoteSampleError

from .loader import RemoteLoader

__all__ = ["RemoteLoader", "RemoteSampleError", "NoProducersError"]
