"""The unit of a pipeline schedule: one action on one microbatch of one stage.

A schedule is plain data, ``exec_order[rank] = [MetaStep(micro_index, MetaStepType.X,
stage_index), ...]``, so it can be validated, simulated and drawn before anything runs, and one
runtime can execute any of them.

Data flow between stages, per microbatch ``m``:

* ``FWD(m, s)`` turns stage ``s``'s input into its output activation; ``BWD(m, s)`` turns the
  gradient of that output into the gradient of the input (and the weight gradients).
  ``BWD_INPUT`` + ``BWD_WEIGHT`` split ``BWD`` in two, as zero-bubble schedules need: the input
  gradient unblocks the previous stage at once, the weight gradient can wait to fill a bubble.
* Between stages on different ranks the data moves by a blocking pair: ``FWD_SEND(m, s)`` on
  stage ``s`` meets ``FWD_RECV(m, s + 1)`` on stage ``s + 1``; ``BWD_SEND(m, s)`` meets
  ``BWD_RECV(m, s - 1)``. The stage index of a comm step is always the stage that executes it.
* Between stages on the same rank (virtual stages) there is nothing to send: ``FWD_HANDOFF(m, s)``
  makes stage ``s``'s output the input of ``s + 1`` and ``BWD_HANDOFF(m, s)`` makes stage ``s``'s
  input gradient the output gradient of ``s - 1``, both locally. They are explicit so that every
  stage boundary of every microbatch has exactly one visible transfer.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Tuple


class MetaStepType(Enum):
    """What a step does. The value is the short code used in reprs and charts."""
    FWD = "F"
    BWD = "B"
    BWD_INPUT = "I"      # split backward, part 1: gradient w.r.t. the stage input
    BWD_WEIGHT = "W"     # split backward, part 2: gradients w.r.t. the stage weights
    FWD_SEND = "SEND_F"
    FWD_RECV = "RECV_F"
    BWD_SEND = "SEND_B"
    BWD_RECV = "RECV_B"
    FWD_HANDOFF = "HANDOFF_F"
    BWD_HANDOFF = "HANDOFF_B"

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE

    @property
    def is_send(self) -> bool:
        return self in (MetaStepType.FWD_SEND, MetaStepType.BWD_SEND)

    @property
    def is_recv(self) -> bool:
        return self in (MetaStepType.FWD_RECV, MetaStepType.BWD_RECV)

    @property
    def is_p2p(self) -> bool:
        """A blocking send or receive (needs the peer rank)."""
        return self.is_send or self.is_recv

    @property
    def is_handoff(self) -> bool:
        return self in (MetaStepType.FWD_HANDOFF, MetaStepType.BWD_HANDOFF)


_COMPUTE = frozenset({MetaStepType.FWD, MetaStepType.BWD, MetaStepType.BWD_INPUT,
                      MetaStepType.BWD_WEIGHT})
_PARTNER = {MetaStepType.FWD_SEND: MetaStepType.FWD_RECV, MetaStepType.FWD_RECV: MetaStepType.FWD_SEND,
            MetaStepType.BWD_SEND: MetaStepType.BWD_RECV, MetaStepType.BWD_RECV: MetaStepType.BWD_SEND}
# gradient of a stage's input: produced by a full or by the input half of a split backward
INPUT_GRAD_TYPES = (MetaStepType.BWD, MetaStepType.BWD_INPUT)

# data that moves between stages: ("act", m, s) is stage s's output, ("grad", m, s) the gradient
# of stage s's input
Data = Tuple[str, int, int]


@dataclass(frozen=True)
class MetaStep:
    """One action of a schedule; ``repr`` is compact: ``F3@s1`` is the forward of microbatch 3
    on stage 1, ``SEND_B0@s2`` stage 2 sending microbatch 0's input gradient."""
    micro_index: int
    type: MetaStepType
    stage_index: int

    def __post_init__(self):
        for name in ("micro_index", "stage_index"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MetaStep: {name}={value!r} must be a non-negative integer")
        if not isinstance(self.type, MetaStepType):
            raise TypeError(f"MetaStep: type={self.type!r} must be a MetaStepType "
                            f"({', '.join(t.name for t in MetaStepType)})")

    def __repr__(self) -> str:
        return f"{self.type.value}{self.micro_index}@s{self.stage_index}"

    @property
    def neighbour_stage(self) -> Optional[int]:
        """The stage a send, receive or handoff talks to (None for compute steps)."""
        t = self.type
        if t in (MetaStepType.FWD_SEND, MetaStepType.FWD_HANDOFF, MetaStepType.BWD_RECV):
            return self.stage_index + 1
        if t in (MetaStepType.BWD_SEND, MetaStepType.BWD_HANDOFF, MetaStepType.FWD_RECV):
            return self.stage_index - 1
        return None

    def peer(self) -> "MetaStep":
        """The step a send or receive must meet on the neighbour's rank."""
        partner = _PARTNER.get(self.type)
        if partner is None:
            raise ValueError(f"{self!r} is not a send or receive; only those have a peer")
        return MetaStep(self.micro_index, partner, self.neighbour_stage)


def produces(step: MetaStep) -> Optional[Data]:
    """The inter-stage data a compute step creates (None for weight gradients)."""
    if step.type is MetaStepType.FWD:
        return ("act", step.micro_index, step.stage_index)
    if step.type in INPUT_GRAD_TYPES:
        return ("grad", step.micro_index, step.stage_index)
    return None


def consumes(step: MetaStep, stage_num: int) -> Tuple[Data, ...]:
    """The data a compute step needs: the forward needs the previous stage's output; a backward
    needs its own forward and the next stage's input gradient; a weight gradient needs the input
    gradient of the same stage (``BWD_INPUT``) done."""
    m, s = step.micro_index, step.stage_index
    if step.type is MetaStepType.FWD:
        return (("act", m, s - 1),) if s > 0 else ()
    if step.type in INPUT_GRAD_TYPES:
        return (("act", m, s),) + ((("grad", m, s + 1),) if s < stage_num - 1 else ())
    if step.type is MetaStepType.BWD_WEIGHT:
        return (("grad", m, s),)
    return ()
