"""Hugging Face Accelerate with ``ferry.DataLoader``: ``prepare(accelerator, model, optimizer, loader)`` in place of
``accelerator.prepare(model, optimizer, loader)``.

``accelerator.prepare`` alone rebuilds a DataLoader over torch's own (its workers would load, not Ferry's
producers). This ``prepare`` calls it, then puts a ferry.DataLoader with accelerate's own sampler shard back inside
each loader it prepared: every process gets the batches accelerate with torch's DataLoader gives it, loaded by Ferry's
producers (docs/porting.md#hugging-face-accelerate). Importing this module imports torch, not accelerate.
"""

from ferry.consumer.dataloader.accelerate import prepare

__all__ = ["prepare"]
