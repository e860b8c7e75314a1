"""Learning-rate schedules (MindFormers names), as Cells usable in PyNative and under ``ms.jit``.

Each schedule maps the 0-based index of the optimizer step being taken (an int or a scalar
Tensor) to the rate for that step; ``at(step)`` gives the same value as a Python float. Warm-up
follows MindFormers: ``warmup_lr_init + (learning_rate - warmup_lr_init) * step / warmup_steps``
for ``step < warmup_steps`` (so the first step of a warm-up uses ``warmup_lr_init``, 0 by
default). Branches are ``ops.select`` on the step, never Python ``if`` on a tensor.
"""
from __future__ import annotations

import math
from typing import Optional

import mindspore as ms
from mindspore import Tensor, nn, ops


def _check(cls: str, name: str, value, minimum=0.0, integer=False):
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum
    if integer and not isinstance(value, int):
        bad = True
    if bad:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{cls}: {name}={value!r} must be {kind} >= {minimum}")


class LearningRateSchedule(nn.Cell):
    """Abstract base: ``construct(step)`` returns a float32 scalar Tensor; ``at(step)`` a Python float.
    Subclasses give the rate after warm-up twice, as a graph (``_after_warmup``) and in Python."""

    def __init__(self, learning_rate: float, warmup_steps: int = 0, warmup_lr_init: float = 0.0):
        super().__init__()
        cls = type(self).__name__
        _check(cls, "learning_rate", learning_rate)
        _check(cls, "warmup_steps", warmup_steps, integer=True)
        _check(cls, "warmup_lr_init", warmup_lr_init)
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.warmup_lr_init = float(warmup_lr_init)

    def _after_warmup(self, step):
        """Rate for ``step >= warmup_steps`` (float32 Tensor step)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _after_warmup (abstract base)")

    def _after_warmup_py(self, step: int) -> float:
        """The same rate in Python floats (``at``: logging, checkpoints), implemented per schedule."""
        raise NotImplementedError(f"{type(self).__name__} must implement _after_warmup_py (abstract base)")

    def construct(self, step):
        step = ops.cast(step, ms.float32)
        decayed = self._after_warmup(step)
        if self.warmup_steps == 0:  # a constant of the schedule: folded at compile time
            return decayed
        warm = self.warmup_lr_init + (self.learning_rate - self.warmup_lr_init) * step / self.warmup_steps
        return ops.select(step < self.warmup_steps, warm, decayed)

    def at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_lr_init + (self.learning_rate - self.warmup_lr_init) * step / self.warmup_steps
        return self._after_warmup_py(step)


class ConstantWarmUpLR(LearningRateSchedule):
    """Linear warm-up, then constant ``learning_rate``."""

    def _after_warmup(self, step):
        return ops.ones_like(step) * self.learning_rate

    def _after_warmup_py(self, step: int) -> float:
        return self.learning_rate


class _Decaying(LearningRateSchedule):
    def __init__(self, learning_rate: float, warmup_steps: int = 0, total_steps: int = 1,
                 lr_end: float = 0.0, warmup_lr_init: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_lr_init)
        cls = type(self).__name__
        _check(cls, "total_steps", total_steps, minimum=1, integer=True)
        _check(cls, "lr_end", lr_end)
        if total_steps <= warmup_steps:
            raise ValueError(f"{cls}: total_steps={total_steps} must be greater than "
                             f"warmup_steps={warmup_steps}")
        self.total_steps, self.lr_end = int(total_steps), float(lr_end)
        self.decay_steps = self.total_steps - self.warmup_steps

    def _progress(self, step):
        return ops.clamp((step - self.warmup_steps) / self.decay_steps, 0.0, 1.0)

    def _progress_py(self, step: int) -> float:
        return min(max((step - self.warmup_steps) / self.decay_steps, 0.0), 1.0)


class LinearWithWarmUpLR(_Decaying):
    """Linear warm-up, then linear decay from ``learning_rate`` to ``lr_end`` at ``total_steps``."""

    def _after_warmup(self, step):
        return self.lr_end + (self.learning_rate - self.lr_end) * (1.0 - self._progress(step))

    def _after_warmup_py(self, step: int) -> float:
        return self.lr_end + (self.learning_rate - self.lr_end) * (1.0 - self._progress_py(step))


class CosineWithWarmUpLR(_Decaying):
    """Linear warm-up, then half a cosine from ``learning_rate`` to ``lr_end`` at ``total_steps``."""

    def _after_warmup(self, step):
        cosine = 0.5 * (1.0 + ops.cos(math.pi * self._progress(step)))
        return self.lr_end + (self.learning_rate - self.lr_end) * cosine

    def _after_warmup_py(self, step: int) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * self._progress_py(step)))
        return self.lr_end + (self.learning_rate - self.lr_end) * cosine


SCHEDULES = {"ConstantWarmUpLR": ConstantWarmUpLR, "LinearWithWarmUpLR": LinearWithWarmUpLR,
             "CosineWithWarmUpLR": CosineWithWarmUpLR}


def build_lr_schedule(type: str, learning_rate: float, warmup_steps: int = 0,
                      total_steps: Optional[int] = None, lr_end: float = 0.0,
                      warmup_lr_init: float = 0.0) -> LearningRateSchedule:
    """A schedule by its MindFormers name (the ``lr_schedule.type`` YAML key)."""
    if type not in SCHEDULES:
        raise ValueError(f"build_lr_schedule: type={type!r} is not known; valid values are "
                         f"{sorted(SCHEDULES)}")
    if type == "ConstantWarmUpLR":
        return ConstantWarmUpLR(learning_rate, warmup_steps, warmup_lr_init)
    if total_steps is None:
        raise ValueError(f"build_lr_schedule: type={type!r} needs total_steps (got None)")
    return SCHEDULES[type](learning_rate, warmup_steps, total_steps, lr_end, warmup_lr_init)


def as_schedule(learning_rate) -> LearningRateSchedule:
    """A float becomes a constant schedule; a schedule is returned as is."""
    if isinstance(learning_rate, LearningRateSchedule):
        return learning_rate
    if isinstance(learning_rate, Tensor):
        learning_rate = float(learning_rate.asnumpy())
    return ConstantWarmUpLR(learning_rate)
