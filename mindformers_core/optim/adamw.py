"""AdamW with decoupled weight decay and bias correction; moments are Parameters.

Per parameter ``p`` with gradient ``g``, at optimizer step ``t`` (1-based) and rate ``lr(t-1)``::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)      # bias_correction=True
    p = p - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)

This is ``torch.optim.AdamW``. ``mindspore.nn.AdamWeightDecay`` is the same update without bias
correction: ``AdamW(..., bias_correction=False)`` reproduces it (same default decay filter:
parameters whose name contains ``beta`` or ``gamma`` are not decayed; same eps placement).

The moments are ordinary Parameters shaped like the parameters, so ``hsdp`` can shrink them to
shards in place (``state_of``) and feed the optimizer shard views through ``apply``.

``AdamW(...)(grads, ok)`` on float32 parameters (the trainer's update) runs MindSpore's fused
``AdamWeightDecay`` kernel, one call per parameter updating it and its moments in place, instead
of ~20 elementwise ops per parameter (PyNative: one kernel launch per parameter instead of ~20).
Bias correction is folded into its scalar inputs, computed once per step::

    k = sqrt(c2) / c1:  lr' = lr * k,  eps' = eps * sqrt(c2),  decay' = decay / k
    p - lr' * (m / (sqrt(v) + eps') + decay' * p) = p - lr * (m_hat / (sqrt(v_hat) + eps) + decay * p)

and a skipped step (``ok`` False) feeds it ``beta1 = beta2 = 1``, ``lr' = 0`` and zero gradients,
which leaves parameters and moments bitwise as they were. ``apply`` (hsdp's shard views, other
dtypes) keeps the elementwise form; the two agree within float32 rounding (tests/test_optim.py).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.ops import operations as P

from .lr_schedule import as_schedule


def default_decay_filter(param) -> bool:
    """MindSpore's default: no weight decay for LayerNorm-style ``beta``/``gamma`` parameters."""
    return "beta" not in param.name and "gamma" not in param.name


class Optimizer(nn.Cell):
    """What ``hsdp`` needs from an optimizer.

    * ``parameters``: the ParameterTuple it updates;
    * ``apply(values, grads, ok=None)``: new values for the given parameter values (full tensors or
      shard views, shaped like the states), updating its states in place; ``construct(grads, ok)``
      applies it to ``parameters`` and assigns the results. ``ok`` (a bool scalar Tensor, or None =
      always) decides inside the graph whether the step happens: when False, values, states and
      the step counter stay as they were (a skipped step, see ``optim.clip.step_is_ok``);
    * ``state_of(i)``: the state Parameters of parameter ``i`` shaped like it (sharded by hsdp).
    """

    def __init__(self, params: Sequence[Parameter]):
        super().__init__(auto_prefix=False)
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: params is empty; pass model.trainable_params()")
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"{type(self).__name__}: params must be Parameters, got {type(p).__name__}")
        self.parameters = ParameterTuple(params)

    def apply(self, values, grads, ok=None):
        raise NotImplementedError(f"{type(self).__name__} must implement apply(values, grads, ok) (abstract base)")

    def state_of(self, index: int) -> Tuple[Parameter, ...]:
        raise NotImplementedError(f"{type(self).__name__} must implement state_of(index) (abstract base)")

    def construct(self, grads, ok=None):
        new = self.apply(self.parameters, grads, ok)
        out = ()
        for i in range(len(self.parameters)):
            out = out + (ops.assign(self.parameters[i], new[i]),)
        return out


class AdamW(Optimizer):
    """AdamW (see the module docstring). ``learning_rate`` is a float or a schedule Cell
    (``CosineWithWarmUpLR``...); ``decay_filter(param) -> bool`` picks the decayed parameters;
    ``fused``: None = MindSpore's fused kernel when every parameter is float32, False = the
    elementwise form (``apply``) everywhere."""

    def __init__(self, params: Sequence[Parameter], learning_rate=1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, bias_correction: bool = True,
                 decay_filter: Optional[Callable] = None, fused: Optional[bool] = None):
        super().__init__(params)
        if len(betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in betas):
            raise ValueError(f"AdamW: betas={tuple(betas)!r} must be two numbers in [0, 1)")
        if eps <= 0:
            raise ValueError(f"AdamW: eps={eps!r} must be > 0")
        if weight_decay < 0:
            raise ValueError(f"AdamW: weight_decay={weight_decay!r} must be >= 0")
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.bias_correction = bool(bias_correction)
        self.learning_rate = as_schedule(learning_rate)
        decay_filter = decay_filter or default_decay_filter
        self.decay = tuple(self.weight_decay if decay_filter(p) else 0.0 for p in self.parameters)
        self.moment1 = ParameterTuple(self._zeros(p, "adam_m") for p in self.parameters)
        self.moment2 = ParameterTuple(self._zeros(p, "adam_v") for p in self.parameters)
        # steps taken so far (int32); the rate of step t+1 is learning_rate(t)
        self.global_step = Parameter(Tensor(np.zeros((), np.int32)), name="global_step",
                                     requires_grad=False)
        # construct: the fused kernel where every parameter is float32 (fused=None), or not (False)
        all_fp32 = all(p.dtype == ms.float32 for p in self.parameters)
        if fused and not all_fp32:
            raise ValueError("AdamW: fused=True needs float32 parameters; got "
                             f"{sorted({str(p.dtype) for p in self.parameters})}")
        self.fused = all_fp32 if fused is None else bool(fused)
        self.fused_op = P.AdamWeightDecay()
        self.decayed = tuple(d > 0 for d in self.decay)

    @staticmethod
    def _zeros(p: Parameter, prefix: str) -> Parameter:
        return Parameter(ops.zeros(tuple(p.shape), p.dtype),
                         name=f"{prefix}.{p.name}", requires_grad=False)

    def state_of(self, index: int) -> Tuple[Parameter, ...]:
        return (self.moment1[index], self.moment2[index])

    def current_lr(self) -> float:
        """The rate the next step will use."""
        return float(self.learning_rate.at(int(self.global_step.asnumpy())))

    def construct(self, grads, ok=None):
        if not self.fused:
            new = self.apply(self.parameters, grads, ok)
            out = ()
            for i in range(len(self.parameters)):
                out = out + (ops.assign(self.parameters[i], new[i]),)
            return out
        lr, c1, c2 = self._advance(ok)
        root_c2 = ops.sqrt(c2)
        k = root_c2 / c1
        lr_k, eps_k = lr * k, self.eps * root_c2
        decay_k = self.weight_decay / k
        no_decay = ops.zeros_like(k)
        beta1 = ops.full((), self.beta1, dtype=ms.float32)
        beta2 = ops.full((), self.beta2, dtype=ms.float32)
        if ok is not None:      # skipped: beta 1, rate 0, zero gradients leave p, m, v as they were
            one = ops.ones_like(k)
            beta1, beta2 = ops.where(ok, beta1, one), ops.where(ok, beta2, one)
            lr_k = ops.where(ok, lr_k, no_decay)
        out = ()
        for i in range(len(self.parameters)):
            g = grads[i] if ok is None else ops.where(ok, grads[i], ops.zeros_like(grads[i]))
            out = out + (self.fused_op(self.parameters[i], self.moment1[i], self.moment2[i], lr_k, beta1, beta2,
                                       eps_k, decay_k if self.decayed[i] else no_decay, g),)
        return out

    def _advance(self, ok):
        """Counts the step (not when ``ok`` is False); returns its rate and bias corrections (Tensors)."""
        if ok is None:
            step = self.global_step + 1
        else:       # a skipped step leaves the counter (hence the lr position) where it was
            step = self.global_step + ops.cast(ok, ms.int32)
        lr = self.learning_rate(step - 1 if ok is None else self.global_step * 1)
        ops.assign(self.global_step, step)
        # a skipped first step leaves step 0: 1 - beta^0 = 0 would make the (unused) corrections 0/0 = NaN,
        # and NaN times a zero rate is NaN in the weights; the corrections of step 1 are as good as any there
        t = ops.maximum(ops.cast(step, ms.float32), ops.ones((), ms.float32))
        if self.bias_correction:
            c1 = 1.0 - ops.pow(self.beta1, t)
            c2 = 1.0 - ops.pow(self.beta2, t)
        else:
            c1 = ops.ones_like(t)
            c2 = ops.ones_like(t)
        return ops.cast(lr, ms.float32), c1, c2

    def apply(self, values, grads, ok=None):
        lr, c1, c2 = self._advance(ok)
        out = ()
        for i in range(len(self.parameters)):
            out = out + (self._update(values[i], grads[i], self.moment1[i], self.moment2[i],
                                      self.decay[i], lr, c1, c2, ok),)
        return out

    def _update(self, p, g, m, v, decay, lr, c1, c2, ok):
        g32 = ops.cast(g, ms.float32)
        p32 = ops.cast(p, ms.float32)
        m_new = self.beta1 * ops.cast(m, ms.float32) + (1.0 - self.beta1) * g32
        v_new = self.beta2 * ops.cast(v, ms.float32) + (1.0 - self.beta2) * g32 * g32
        update = (m_new / c1) / (ops.sqrt(v_new / c2) + self.eps)
        p_new = p32 - lr * (update + decay * p32)
        if ok is not None:      # skipped: keep the old values (where() does not carry the NaNs over)
            m_new = ops.where(ok, m_new, ops.cast(m, ms.float32))
            v_new = ops.where(ok, v_new, ops.cast(v, ms.float32))
            p_new = ops.where(ok, p_new, p32)
        ops.assign(m, ops.cast(m_new, m.dtype))
        ops.assign(v, ops.cast(v_new, v.dtype))
        return ops.cast(p_new, p.dtype)
