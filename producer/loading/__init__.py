"""A TASK becomes a batch (docs/ARCHITECTURE.md#producer): the datasets a producer serves (:mod:`.pool`), the
loading and batch threads (:mod:`.samplepool`, :mod:`.batcher`), one sample (:mod:`.samples`), collation
(:mod:`.collate`, :mod:`.convert`, :mod:`.culprits`), sharded and iterable datasets (:mod:`.shards`,
:mod:`.streams`) and the compression of a batch's frames (:mod:`.compressing`).
"""
