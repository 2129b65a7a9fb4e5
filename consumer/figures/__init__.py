"""A loader's figures (docs/ARCHITECTURE.md#observability), in one place.

* :mod:`.counters`: the counters of ``stats()``, each declared once with its type;
* :mod:`.observer`: what each epoch teaches, on the training thread: waits, the progress line, the diagnosis;
* :mod:`.diagnosis`: what bounds an epoch, in words.
"""
