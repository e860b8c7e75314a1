"""The batch: a dict from the data pipeline to the model and its loss.

Keys, in the order the model takes them as arguments (``GPTModel.construct``):

* ``input_ids`` (b, s) int -- required;
* ``labels`` (b, s) int -- required for training (the next token of each position);
* ``loss_mask`` (b, s) float -- 1 for tokens the loss averages over, 0 for prompt and padding (absent: all);
* ``position_ids`` (b, s) int -- each token's position (absent: 0..s-1 in every row);
* ``segment_ids`` (b, s) int -- each token's document in a packed row (absent: one document per row).

Pure Python/NumPy: the data pipeline makes batches, the trainer turns them into the model's positional
arguments (``model_args``) -- the same tuple on every micro-step and every rank, so a compiled step is
compiled once.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

BATCH_KEYS: Tuple[str, ...] = ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids")
REQUIRED = ("input_ids",)
_DTYPES = {"input_ids": np.int32, "labels": np.int32, "loss_mask": np.float32, "position_ids": np.int32,
           "segment_ids": np.int32}

Batch = Dict[str, np.ndarray]


def check_batch(batch: Mapping[str, Any]) -> None:
    """``ValueError`` naming the key for a batch that is not a dict of equal (b, s) arrays of known keys."""
    if not isinstance(batch, Mapping):
        raise ValueError(f"a batch must be a dict with keys from {list(BATCH_KEYS)}, got {type(batch).__name__}")
    unknown = sorted(set(batch) - set(BATCH_KEYS))
    if unknown:
        raise ValueError(f"batch keys {unknown} are not known; valid keys: {list(BATCH_KEYS)}")
    for key in REQUIRED:
        if batch.get(key) is None:
            raise ValueError(f"batch key {key!r} is missing; a batch needs {list(REQUIRED)}")
    shape = np.shape(batch["input_ids"])
    for key, value in batch.items():
        if value is not None and np.shape(value) != shape:
            raise ValueError(f"batch key {key!r} has shape {np.shape(value)}; every key must have input_ids' "
                             f"shape {shape}")


def stack_samples(samples: Sequence[Any]) -> Batch:
    """Rows -> a batch. A row is a dict of batch keys, or an ``(input_ids, labels)`` pair (the packed
    pretraining datasets)."""
    first = samples[0]
    if isinstance(first, Mapping):
        keys = [k for k in BATCH_KEYS if first.get(k) is not None]
        batch = {k: np.stack([np.asarray(r[k]) for r in samples]).astype(_DTYPES[k]) for k in keys}
    else:
        batch = {"input_ids": np.stack([np.asarray(r[0]) for r in samples]).astype(np.int32),
                 "labels": np.stack([np.asarray(r[1]) for r in samples]).astype(np.int32)}
    check_batch(batch)
    return batch


def map_batch(batch: Batch, fn: Callable[[np.ndarray], np.ndarray]) -> Batch:
    """``fn`` applied to every array of the batch (e.g. this context-parallel rank's tokens)."""
    return {k: fn(v) for k, v in batch.items()}


def model_args(batch: Mapping[str, Any], to_tensor: Optional[Callable] = None) -> Tuple:
    """The model's positional arguments: the batch's values in :data:`BATCH_KEYS` order, None for a key
    the batch lacks, trailing absent keys left off (``(ids, labels)`` for a pretraining batch)."""
    present = [k for k in BATCH_KEYS if batch.get(k) is not None]
    last = BATCH_KEYS.index(present[-1]) if present else -1
    conv = to_tensor or (lambda a: a)
    return tuple(None if batch.get(k) is None else conv(batch[k]) for k in BATCH_KEYS[:last + 1])
