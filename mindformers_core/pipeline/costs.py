"""How long each kind of step takes, in abstract time units (for building and simulating orders)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .meta_step import MetaStep, MetaStepType


def _check(name: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        valid = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name}={value!r} must be {valid}")


@dataclass(frozen=True)
class StepCosts:
    """Durations of compute steps and of one send/recv. A split backward defaults to half of
    ``bwd_time`` for each part (``bwd_input_time + bwd_weight_time == bwd_time``), so split and
    unsplit schedules do the same total work. Handoffs between stages on one rank cost nothing.

    An overlapped ``FWD_BWD`` unit costs ``F + B' - overlap * min(F, B')`` (``B'``: its backward
    half, a BWD or BWD_INPUT): ``overlap=0`` (the default) runs the halves one after the other,
    as the CPU runtime does; ``overlap=1`` hides the shorter half completely (``max(F, B')``), the
    ideal of DualPipe's F&B on hardware where one half's communication and the other's compute
    overlap. A wait step costs nothing itself (the replay adds the time it blocks)."""
    fwd_time: float = 1.0
    bwd_time: float = 2.0
    bwd_input_time: Optional[float] = None
    bwd_weight_time: Optional[float] = None
    comm_time: float = 0.0
    overlap: float = 0.0

    def __post_init__(self):
        _check("fwd_time", self.fwd_time)
        _check("bwd_time", self.bwd_time)
        _check("comm_time", self.comm_time, allow_zero=True)
        if self.bwd_input_time is None:
            object.__setattr__(self, "bwd_input_time", self.bwd_time / 2)
        _check("bwd_input_time", self.bwd_input_time)
        if self.bwd_weight_time is None:
            if self.bwd_input_time >= self.bwd_time:
                raise ValueError(f"bwd_input_time={self.bwd_input_time!r} leaves no time for the weight "
                                 f"gradient out of bwd_time={self.bwd_time!r}; give bwd_weight_time too")
            object.__setattr__(self, "bwd_weight_time", self.bwd_time - self.bwd_input_time)
        _check("bwd_weight_time", self.bwd_weight_time)
        _check("overlap", self.overlap, allow_zero=True)
        if self.overlap > 1:
            raise ValueError(f"overlap={self.overlap!r} must be in [0, 1] (the fraction of the shorter half of "
                             "a FWD_BWD unit hidden behind the other: 0 none, 1 all)")

    def fwd_bwd_duration(self, step: MetaStep) -> float:
        """The duration of a FWD_BWD unit (see the class doc)."""
        f, b = self.fwd_time, self.duration(step.backward)
        return f + b - self.overlap * min(f, b)

    def duration(self, step: MetaStep) -> float:
        t = step.type
        if t is MetaStepType.FWD:
            return self.fwd_time
        if t is MetaStepType.BWD:
            return self.bwd_time
        if t is MetaStepType.BWD_INPUT:
            return self.bwd_input_time
        if t is MetaStepType.BWD_WEIGHT:
            return self.bwd_weight_time
        if t is MetaStepType.FWD_BWD:
            return self.fwd_bwd_duration(step)
        return self.comm_time if t.is_p2p else 0.0
