"""Next-token cross-entropy over a vocabulary in the last dim, in float32.

One ``cross_entropy_last_dim`` op for the sharding pass: with vocab-split logits the pass runs
the vocab-parallel kernel (max, sum-exp and target logit reduced over tp), so this Cell stays the
plain single-card ``mean(logsumexp(logits) - logits[label])``. It uses MindSpore's fused
``SparseSoftmaxCrossEntropyWithLogits`` (stable, about 5x faster on CPU than the composite formula).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


class VocabParallelCrossEntropy(nn.Cell):
    """logits (b, s, V), labels (b, s) int -> scalar mean loss over all b*s tokens."""
    sharding_op = "cross_entropy_last_dim"
    sharding_params = ()

    def sharding_attrs(self) -> dict:
        return {"reduction": "mean"}

    def shard(self, config):
        return None, None, None

    def __init__(self):
        super().__init__()
        self.cross_entropy = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, logits, labels):
        logits = ops.cast(logits, ms.float32)
        return self.cross_entropy(logits.reshape(-1, logits.shape[-1]), ops.cast(labels, ms.int32).reshape(-1))
