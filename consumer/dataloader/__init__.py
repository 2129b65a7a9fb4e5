"""``ferry.DataLoader``: torch's DataLoader signature and batches, Ferry's producers (docs/porting.md).

* :mod:`~ferry.consumer.dataloader.loader`: the class, its lifecycle (nothing starts before the first ``iter()``),
  its state;
* :mod:`~ferry.consumer.dataloader.passes`: one pass drawn from torch's samplers as DataLoader draws it, and drawn
  again on resume;
* :mod:`~ferry.consumer.dataloader.engine`: what DataLoader's options become (RemoteLoader's keywords);
* :mod:`~ferry.consumer.dataloader.inprocess`: ``num_workers=0``, the pass loaded in the calling process.

Importing this package imports torch.
"""

from ferry.consumer.dataloader.loader import DataLoader

__all__ = ["DataLoader"]
