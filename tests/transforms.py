"""Per-sample transforms for the producer-side hook (``--transform tests.transforms:name``)."""


def negate_and_tag(sample):
    array, label = sample
    return -array, label + 100
