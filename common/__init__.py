"""Code shared by Ferry's producer and consumer.

It holds the wire protocol (:mod:`ferry.common.protocol`), the batch tree codec (:mod:`ferry.common.codec`), the
epoch plan (:mod:`ferry.common.plan`), the dataset specs and built-in datasets (:mod:`ferry.common.datasets`), the
error types (:mod:`ferry.common.errors`) and the named bounds (:mod:`ferry.common.constants`).

This package imports neither ``producer`` nor ``consumer``, and it does not import torch at module level,
so a producer starts without torch.
"""
