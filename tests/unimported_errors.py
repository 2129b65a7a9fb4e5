"""An exception module that only producers import (tests/test_error_types.py checks that the trainer never
imports it just because a producer named one of its classes)."""


class DecoderError(OSError):
    """A decoder library's error: an OSError, as PIL's UnidentifiedImageError is."""
