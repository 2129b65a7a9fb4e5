"""Ferry's benchmark harness: Ferry and torch.utils.data.DataLoader side by side, in the same run.

``python -m benchmarks`` runs every scenario; ``--quick`` a short version (about 3 minutes on 2 cores).
Results go to ``benchmarks/results/<date>.json`` and a Markdown table is printed at the end.

Method (these shared machines are noisy): the two systems alternate (A B A B), each measurement is
repeated at least 3 times, and we report the median with min..max, and ratios Ferry / DataLoader.
"""
