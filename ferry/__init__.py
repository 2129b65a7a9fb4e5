"""The ``ferry`` command: one entry for the producer, the demo and the tools.

It belongs to neither side, so it lives in its own small package: ``ferry produce`` must not import
torch (the consumer does), and ``common`` imports neither side.
"""
