"""Per-sample transforms for the producer-side hook (``--transform tests.transforms:name``)."""


def negate_and_tag(sample):
    array, label = sample
    return -array, label + 100


def slow_identity(sample):
    """The sample unchanged, 15 ms later: producers slower than the trainer, so that each has batches in flight."""
    import time

    time.sleep(0.015)
    return sample


def scaled_collate(samples, alpha=1.0):
    """A collate_fn with a setting (as mixup's alpha): the stacked arrays times ``alpha``, and the labels."""
    import numpy as np

    arrays, labels = zip(*samples)
    return np.stack(arrays) * alpha, np.array(labels)


class Shift:
    """A transform built with its settings: adds ``amount`` to every sample's array."""

    def __init__(self, amount):
        self.amount = amount

    def __call__(self, sample):
        array, label = sample
        return array + self.amount, label
