"""Per-sample transforms for the producer-side hook (``--transform tests.transforms:name``)."""


def negate_and_tag(sample):
    array, label = sample
    return -array, label + 100


def slow_identity(sample):
    """The sample unchanged, 15 ms later: producers slower than the trainer, so that each has batches in flight."""
    import time

    time.sleep(0.015)
    return sample
