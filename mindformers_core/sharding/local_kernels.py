"""Local computations that differ from "the same op on local shards" (``RuleResult.local``).

Only atomic Cells (those with a ``sharding_op``) can get one: ``parallelize`` swaps the Cell for a
kernel Cell that keeps the original as ``inner`` (so parameter names and objects are unchanged)
and computes the rank's part. The communication lives here, in the parallel layer, never in
model code.

Which kernel an op gets is registered next to its rule (``rules.registry.register_local_kernel``);
``parallelize`` looks it up by the ``RuleResult.local`` name.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ..distributed.comm import kernels as K
from ..distributed.comm.autograd import AllReduceExtremum, Differentiable, Identity
from ..distributed.comm.kernels import CommCell
from .boundary import inner_attribute


class VocabParallelLookup(CommCell):
    """Embedding lookup on this rank's vocabulary slice: ids outside it give zeros, so the output is
    a partial sum over the vocab axes (reduced at the Cell's output boundary). The replaced Cell's
    attributes stay reachable through it (``embedding.word_embeddings.weight``: the table a tied output
    layer multiplies by, this rank's vocabulary rows)."""

    mfc_replaces_inner = True   # annotations.replaces_inner: reads inner's weight without calling inner
    __getattr__ = inner_attribute

    def __init__(self, inner: nn.Cell, weight_attr: str, start: int, size: int):
        super().__init__()
        self.inner = inner
        self.weight_attr = weight_attr
        self.start = start
        self.end = start + size

    def construct(self, ids):
        weight = getattr(self.inner, self.weight_attr)
        inside = ops.logical_and(ids >= self.start, ids < self.end)
        local_ids = ops.select(inside, ids - self.start, ops.zeros_like(ids))
        out = ops.gather(weight, local_ids, 0)
        return out * ops.expand_dims(inside.astype(out.dtype), -1)


class VocabParallelCrossEntropyKernel(CommCell):
    """Cross-entropy with the classes (last dim) split over a group, never gathering the logits:
    global max, global sum of exponentials and the target logit each take one all-reduce."""

    def __init__(self, group, start: int, size: int, reduction: str = "mean"):
        super().__init__()
        self.max = AllReduceExtremum(group, "max")
        self.sum_exp_reduce = Differentiable(K.AllReduceKernel(group, "sum"), Identity())
        self.target_reduce = Differentiable(K.AllReduceKernel(group, "sum"), Identity())
        self.start = start
        self.end = start + size
        self.reduction = reduction

    def construct(self, logits, labels):
        logits = logits.astype(ms.float32)
        local_max = ops.stop_gradient(logits.max(axis=-1, keepdims=True))
        global_max = ops.stop_gradient(self.max(local_max))
        shifted = logits - global_max
        sum_exp = self.sum_exp_reduce(ops.exp(shifted).sum(axis=-1))
        inside = ops.logical_and(labels >= self.start, labels < self.end)
        local_labels = ops.select(inside, labels - self.start, ops.zeros_like(labels))
        picked = ops.gather_elements(shifted, -1, ops.expand_dims(local_labels, -1)).squeeze(-1)
        picked = picked * inside.astype(picked.dtype)
        target = self.target_reduce(picked)
        loss = ops.log(sum_exp) - target
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss
