"""The bad-step guard: whether an optimizer step happens, decided from the global gradient norm.

A non-finite loss gives non-finite gradients, and the global norm (reduced over every parallel
group before clipping) is the same number on every rank: deciding on it skips a step on all
ranks together, with no extra communication. Inside a graph ``guard(norm)`` is a bool Tensor the
optimizer reads (``Optimizer.apply(values, grads, ok)``: a skipped step leaves weights, moments
and the step counter untouched); in Python ``is_ok(norm)`` gives the same answer for logging.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
from mindspore import nn, ops


class StepGuard(nn.Cell):
    """``skip_non_finite``: skip a step whose norm is NaN or inf; ``norm_threshold``: also skip a
    step whose norm exceeds it (None = no limit). Both off: ``enabled`` is False (no guard)."""

    def __init__(self, skip_non_finite: bool = True, norm_threshold: Optional[float] = None):
        super().__init__(auto_prefix=False)
        if norm_threshold is not None and not (isinstance(norm_threshold, (int, float)) and norm_threshold > 0
                                               and not isinstance(norm_threshold, bool)):
            raise ValueError(f"StepGuard: norm_threshold={norm_threshold!r} must be a number > 0 or None")
        self.skip_non_finite = bool(skip_non_finite)
        self.norm_threshold = None if norm_threshold is None else float(norm_threshold)
        # float32, as the graph compares it (a norm equal to the threshold passes in both)
        self._limit = np.float32(math.inf if norm_threshold is None else norm_threshold)
        self.limit = float(self._limit)

    @property
    def enabled(self) -> bool:
        return self.skip_non_finite or self.norm_threshold is not None

    def construct(self, norm):
        """The decision as a bool scalar Tensor (for use inside a step graph)."""
        within = norm <= self.limit                  # NaN compares False: skipped as well
        if self.skip_non_finite:
            return ops.logical_and(ops.isfinite(norm), within)
        return within

    def is_ok(self, norm: float) -> bool:
        """The same decision for a norm read back in Python."""
        value = np.float32(norm)
        if self.skip_non_finite and not np.isfinite(value):
            return False
        return bool(value <= self._limit)

    def describe(self) -> str:
        parts = (["non-finite gradient norm"] if self.skip_non_finite else []) + \
            ([f"gradient norm > {self.norm_threshold:g}"] if self.norm_threshold is not None else [])
        return " or ".join(parts) or "nothing"
