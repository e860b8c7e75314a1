"""The unit of a pipeline schedule: one action on one microbatch of one stage.

A schedule is plain data, ``exec_order[rank] = [MetaStep(micro_index, MetaStepType.X,
stage_index), ...]``, so it can be validated, simulated and drawn before anything runs, and one
runtime can execute any of them.

Data flow between stages, per microbatch ``m``:

* ``FWD(m, s)`` turns stage ``s``'s input into its output activation; ``BWD(m, s)`` turns the
  gradient of that output into the gradient of the input (and the weight gradients).
  ``BWD_INPUT`` + ``BWD_WEIGHT`` split ``BWD`` in two, as zero-bubble schedules need: the input
  gradient unblocks the previous stage at once, the weight gradient can wait to fill a bubble.
* ``FWD_BWD`` is one overlapped unit (DualPipe's "F&B"): the forward of ``(m, s)`` and a backward
  (``BWD`` or ``BWD_INPUT``) of another microbatch/stage of the same rank, run together so that
  one half's communication (e.g. a MoE all-to-all) hides behind the other half's compute. Build
  it with ``MetaStep.overlapped(forward, backward)``; ``micro_index``/``stage_index`` are the
  forward's, ``backward`` holds the backward MetaStep, ``parts`` gives both. The two halves must
  be independent: everything either needs comes earlier in the rank's list. Its cost is
  ``StepCosts.fwd_bwd_duration`` (F + B by default, less with ``overlap``). A runtime without an
  overlapped kernel runs the forward, then the backward (``lowering.lower_for_runtime``).
* Between stages on different ranks the data moves by a point-to-point pair: ``FWD_SEND(m, s)``
  on stage ``s`` meets ``FWD_RECV(m, s + 1)`` on stage ``s + 1``; ``BWD_SEND(m, s)`` meets
  ``BWD_RECV(m, s - 1)``. The stage index of a comm step is always the stage that executes it.
* Between stages on the same rank (virtual stages) there is nothing to send: ``FWD_HANDOFF(m, s)``
  makes stage ``s``'s output the input of ``s + 1`` and ``BWD_HANDOFF(m, s)`` makes stage ``s``'s
  input gradient the output gradient of ``s - 1``, both locally. They are explicit so that every
  stage boundary of every microbatch has exactly one visible transfer.

Two models of point-to-point, chosen by the ``blocking_send`` argument of ``validate_schedule``,
``simulate`` and ``add_communication`` (the order itself is the same kind of data in both):

* **blocking** (``blocking_send=True``, the CPU backend, which emulates send/recv with a two-rank
  all-reduce): a send and its receive are a rendezvous; both ranks wait until both arrive, and the
  transfer is done when the pair ends.
* **posted** (``blocking_send=False``, ``isend``/``irecv`` on Ascend/GPU): a send only *posts* the
  transfer and returns at once (the runtime waits for all posted sends at the end of the step);
  a receive *posts* its buffer. The transfer runs from the moment both are posted for
  ``comm_time``. The data may be used only after a wait: ``FWD_WAIT(m, s)`` / ``BWD_WAIT(m, s)``
  (same microbatch and stage as the ``FWD_RECV`` / ``BWD_RECV`` it completes) blocks until the
  transfer is done; place it right before the step that uses the data and the receive as early
  as you like. A receive with no wait step later in its rank's list waits where it stands
  (post + wait in one: a blocking receive). PyTorch's orders have no such receive: its runtime
  waits on every receive in the step that uses the data, wherever the receive was posted (so a
  PyTorch order reads here as its receives, each with a wait right before its consumer). A rank
  can only block at a wait, so a posted order deadlocks only if a wait needs a send that comes
  after a wait on the sender's side that (transitively) needs this rank: the validator replays
  it and names the cycle. Between two ranks, the receiver must post its receives from the
  sender in the order the sender posts its sends to it (validator rule ``pair_order``):
  transports that match messages per pair in post order (NCCL and HCCL ignore tags) would hand
  a receive another message of the same shape, silently.
  In the blocking model a wait step is a no-op (its receive already completed the transfer).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Optional, Tuple


class MetaStepType(Enum):
    """What a step does. The value is the short code used in reprs and charts."""
    FWD = "F"
    BWD = "B"
    BWD_INPUT = "I"      # split backward, part 1: gradient w.r.t. the stage input
    BWD_WEIGHT = "W"     # split backward, part 2: gradients w.r.t. the stage weights
    FWD_BWD = "FB"       # one overlapped unit: a forward and another chunk's backward (DualPipe)
    FWD_SEND = "SEND_F"
    FWD_RECV = "RECV_F"
    BWD_SEND = "SEND_B"
    BWD_RECV = "RECV_B"
    FWD_WAIT = "WAIT_F"  # posted model: wait for the FWD_RECV of the same (micro, stage)
    BWD_WAIT = "WAIT_B"  # posted model: wait for the BWD_RECV of the same (micro, stage)
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
        """A send or receive (needs the peer rank)."""
        return self.is_send or self.is_recv

    @property
    def is_wait(self) -> bool:
        """The wait completing a posted receive."""
        return self in (MetaStepType.FWD_WAIT, MetaStepType.BWD_WAIT)

    @property
    def is_handoff(self) -> bool:
        return self in (MetaStepType.FWD_HANDOFF, MetaStepType.BWD_HANDOFF)


_COMPUTE = frozenset({MetaStepType.FWD, MetaStepType.BWD, MetaStepType.BWD_INPUT,
                      MetaStepType.BWD_WEIGHT, MetaStepType.FWD_BWD})
_PARTNER = {MetaStepType.FWD_SEND: MetaStepType.FWD_RECV, MetaStepType.FWD_RECV: MetaStepType.FWD_SEND,
            MetaStepType.BWD_SEND: MetaStepType.BWD_RECV, MetaStepType.BWD_RECV: MetaStepType.BWD_SEND}
_WAIT_OF = {MetaStepType.FWD_RECV: MetaStepType.FWD_WAIT, MetaStepType.BWD_RECV: MetaStepType.BWD_WAIT}
_RECV_OF = {w: r for r, w in _WAIT_OF.items()}
# gradient of a stage's input: produced by a full or by the input half of a split backward
INPUT_GRAD_TYPES = (MetaStepType.BWD, MetaStepType.BWD_INPUT)

# data that moves between stages: ("act", m, s) is stage s's output, ("grad", m, s) the gradient
# of stage s's input
Data = Tuple[str, int, int]


@dataclass(frozen=True)
class MetaStep:
    """One action of a schedule; ``repr`` is compact: ``F3@s1`` is the forward of microbatch 3
    on stage 1, ``SEND_B0@s2`` stage 2 sending microbatch 0's input gradient, ``F3@s1+B1@s6`` an
    overlapped unit (``FWD_BWD``: forward of 3 on stage 1 with the backward of 1 on stage 6).
    ``backward`` is set only for ``FWD_BWD`` (use ``MetaStep.overlapped``)."""
    micro_index: int
    type: MetaStepType
    stage_index: int
    backward: Optional["MetaStep"] = None

    def __post_init__(self):
        for name in ("micro_index", "stage_index"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MetaStep: {name}={value!r} must be a non-negative integer")
        if not isinstance(self.type, MetaStepType):
            raise TypeError(f"MetaStep: type={self.type!r} must be a MetaStepType "
                            f"({', '.join(t.name for t in MetaStepType)})")
        if self.type is MetaStepType.FWD_BWD:
            b = self.backward
            if not isinstance(b, MetaStep) or b.type not in INPUT_GRAD_TYPES:
                raise ValueError(f"MetaStep: a FWD_BWD step needs backward=<a BWD or BWD_INPUT MetaStep>, "
                                 f"got backward={b!r}; build it with MetaStep.overlapped(forward, backward)")
            if (b.micro_index, b.stage_index) == (self.micro_index, self.stage_index):
                raise ValueError(f"MetaStep: FWD_BWD overlaps the forward and backward of the same microbatch "
                                 f"{self.micro_index} on stage {self.stage_index}; the backward needs that "
                                 "forward done first, so they cannot run as one unit")
        elif self.backward is not None:
            raise ValueError(f"MetaStep: backward={self.backward!r} is only for FWD_BWD steps, not {self.type.name}")

    @classmethod
    def overlapped(cls, forward: "MetaStep", backward: "MetaStep") -> "MetaStep":
        """The ``FWD_BWD`` unit running ``forward`` (a FWD) and ``backward`` (a BWD or
        BWD_INPUT) together."""
        if not isinstance(forward, MetaStep) or forward.type is not MetaStepType.FWD:
            raise ValueError(f"MetaStep.overlapped: forward={forward!r} must be a FWD MetaStep")
        return cls(forward.micro_index, MetaStepType.FWD_BWD, forward.stage_index, backward)

    @property
    def parts(self) -> Tuple["MetaStep", ...]:
        """The single steps this step runs: ``(forward, backward)`` for ``FWD_BWD``, else ``(self,)``."""
        if self.type is MetaStepType.FWD_BWD:
            return (MetaStep(self.micro_index, MetaStepType.FWD, self.stage_index), self.backward)
        return (self,)

    def __repr__(self) -> str:
        if self.type is MetaStepType.FWD_BWD:
            return f"F{self.micro_index}@s{self.stage_index}+{self.backward!r}"
        return f"{self.type.value}{self.micro_index}@s{self.stage_index}"

    @property
    def neighbour_stage(self) -> Optional[int]:
        """The stage a send, receive, wait or handoff talks to (None for compute steps)."""
        t = self.type
        if t in (MetaStepType.FWD_SEND, MetaStepType.FWD_HANDOFF, MetaStepType.BWD_RECV, MetaStepType.BWD_WAIT):
            return self.stage_index + 1
        if t in (MetaStepType.BWD_SEND, MetaStepType.BWD_HANDOFF, MetaStepType.FWD_RECV, MetaStepType.FWD_WAIT):
            return self.stage_index - 1
        return None

    def peer(self) -> "MetaStep":
        """The step a send or receive must meet on the neighbour's rank (for a wait: the send
        its receive meets)."""
        if self.type.is_wait:
            return self.recv().peer()
        partner = _PARTNER.get(self.type)
        if partner is None:
            raise ValueError(f"{self!r} is not a send or receive; only those have a peer")
        return MetaStep(self.micro_index, partner, self.neighbour_stage)

    def wait(self) -> "MetaStep":
        """The wait step completing this posted receive."""
        if self.type not in _WAIT_OF:
            raise ValueError(f"{self!r} is not a receive; only a receive has a wait step")
        return MetaStep(self.micro_index, _WAIT_OF[self.type], self.stage_index)

    def recv(self) -> "MetaStep":
        """The receive this wait step completes."""
        if self.type not in _RECV_OF:
            raise ValueError(f"{self!r} is not a wait step")
        return MetaStep(self.micro_index, _RECV_OF[self.type], self.stage_index)


def produces_all(step: MetaStep) -> Tuple[Data, ...]:
    """Every inter-stage datum a compute step creates (both halves of a FWD_BWD)."""
    return tuple(d for part in step.parts for d in (produces(part),) if d is not None)


# routes: microbatch -> the stages it runs, a contiguous range (None: every microbatch runs every
# stage 0..stage_num-1, one chain). DualPipe's two directions are two routes over 2p stage indices:
# the first stage of a route takes the microbatch's input, its last computes the loss, and no data
# crosses from one route's last stage to the next route's first.
Routes = Optional[Mapping[int, range]]


def route_of(micro_index: int, stage_num: int, routes: Routes = None) -> range:
    """The stages microbatch ``micro_index`` runs (``range(stage_num)`` without routes)."""
    if routes is None:
        return range(stage_num)
    return routes.get(micro_index, range(0))


def consumes_all(step: MetaStep, stage_num: int, routes: Routes = None) -> Tuple[Data, ...]:
    """Every datum a compute step needs (both halves of a FWD_BWD)."""
    return tuple(d for part in step.parts for d in consumes(part, stage_num, routes))


def produces(step: MetaStep) -> Optional[Data]:
    """The inter-stage data a single compute step creates (None for weight gradients; for a
    FWD_BWD use ``produces_all``)."""
    if step.type is MetaStepType.FWD:
        return ("act", step.micro_index, step.stage_index)
    if step.type in INPUT_GRAD_TYPES:
        return ("grad", step.micro_index, step.stage_index)
    return None


def consumes(step: MetaStep, stage_num: int, routes: Routes = None) -> Tuple[Data, ...]:
    """The data a compute step needs: the forward needs the previous stage's output; a backward
    needs its own forward and the next stage's input gradient; a weight gradient needs the input
    gradient of the same stage (``BWD_INPUT``) done. A FWD_BWD needs what both halves need.
    With ``routes`` the first and last stage are those of the microbatch's route."""
    m, s = step.micro_index, step.stage_index
    if step.type is MetaStepType.FWD_BWD:
        return consumes_all(step, stage_num, routes)
    route = route_of(m, stage_num, routes)
    first, last = (route[0], route[-1]) if len(route) else (0, stage_num - 1)
    if step.type is MetaStepType.FWD:
        return (("act", m, s - 1),) if s > first else ()
    if step.type in INPUT_GRAD_TYPES:
        return (("act", m, s),) + ((("grad", m, s + 1),) if s < last else ())
    if step.type is MetaStepType.BWD_WEIGHT:
        return (("grad", m, s),)
    return ()
