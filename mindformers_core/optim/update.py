"""``GradientUpdate``: reduce -> clip -> guard -> update, the one order every training step applies.

Who reduces and who updates differ between strategies; the order does not:

* ``reduce(grads, loss) -> (grads, loss)``: the strategy's reduction (the model-parallel
  ``GradientReducer`` of a plain step; hsdp's data-parallel all-reduce / reduce-scatter, see
  ``hsdp.step.HsdpReduce``), the loss passing through or reduced along;
* ``clip`` (``ClipGradNorm`` or None): the global norm, read by the guard and the log; None when
  nothing needs it (no pass over the gradients, no all-reduce);
* ``guard`` (``StepGuard`` or None): whether the step happens, decided from the norm;
* ``apply(grads, ok)``: the optimizer (``AdamW``) or hsdp's ``ShardedUpdate``; ``ok`` a bool
  Tensor (None: always).

A Cell: ``construct`` runs inside a compiled step (the guard's decision is a Tensor the update
reads); ``eager`` is the PyNative form that decides on the host (one read of the norm), so a step
runs the fused update alone and a skipped one nothing.
"""
from __future__ import annotations

from mindspore import nn


class GradientUpdate(nn.Cell):
    """``construct(grads, loss) -> (loss, norm, what apply returned)``. ``norm`` is None without
    ``clip``, or the loss when ``tensor_outputs`` (every output a Tensor: a compiled step can then
    keep MindSpore's asynchronous launch, see ``common.graphs``; hsdp's steps rely on it). ``apply``
    is held as ``update`` (``nn.Cell.apply`` is taken)."""

    def __init__(self, reduce: nn.Cell, apply: nn.Cell, clip=None, guard=None, tensor_outputs: bool = False):
        super().__init__(auto_prefix=False)   # no prefix: the optimizer's Parameters keep their names
        if guard is not None and clip is None:
            raise ValueError("train_step: step_guard reads the global gradient norm; give max_grad_norm "
                             "(math.inf computes the norm without clipping)")
        self.reduce, self.update, self.clip, self.guard = reduce, apply, clip, guard
        self.tensor_outputs = tensor_outputs

    def reduce_and_clip(self, grads, loss):
        grads, loss = self.reduce(grads, loss)
        if self.clip is None:
            return grads, loss, (loss if self.tensor_outputs else None)
        grads, norm = self.clip(grads)
        return grads, loss, norm

    def construct(self, grads, loss):
        grads, loss, norm = self.reduce_and_clip(grads, loss)
        if self.guard is None:
            return loss, norm, self.update(grads)
        return loss, norm, self.update(grads, self.guard(norm))

    def eager(self, grads, loss):
        """The step in PyNative, the guard decided on the host: ``(loss, norm, applied)``."""
        grads, loss, norm = self.reduce_and_clip(grads, loss)
        if self.guard is not None and not self.guard.is_ok(float(norm.asnumpy())):
            return loss, norm, None
        return loss, norm, self.update(grads)
