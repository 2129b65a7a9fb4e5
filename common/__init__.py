"""Code shared by Ferry's producer and consumer.

It holds the wire protocol (:mod:`common.protocol`), the batch tree codec (:mod:`common.codec`), the
epoch plan (:mod:`common.plan`), the dataset specs and built-in datasets (:mod:`common.datasets`), the
error types (:mod:`common.errors`) and the named bounds (:mod:`common.constants`).

This package imports neither ``producer`` nor ``consumer``, and it does not import torch at module level,
so a producer starts without torch.
"""
