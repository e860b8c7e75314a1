"""DualPipeV's compute order (DeepSeek-V3's DualPipe cut in half, as Sea AI Lab's "cut-in-half").

Placement is ZBV's V: with ``p`` pipeline ranks there are ``2p`` stages, rank ``r`` holds chunk 0
= stage ``r`` and chunk 1 = stage ``2p-1-r``, so rank 0 holds the first stage and the loss. Every
chunk runs its forwards in microbatch order and its backwards in microbatch order. What makes
DualPipeV different from ZBV is the steady state: a forward of one chunk and a full backward of
the other run as ONE overlapped unit (``FWD_BWD``), so that one half's communication (MoE
all-to-all, pipeline transfers) can hide behind the other half's compute; the warm-up and
cool-down split some backwards into input and weight gradients (zero bubble) to fill the gaps.

Phases on rank ``r`` (F0/F1: forward of chunk 0/1, B: full backward, I/W: split backward whose
weight half waits in a first-in first-out queue, ``F0&B1``: one overlapped unit), m >= 2p:

====  ===================  =====================  ==================================================
      repeat               steps                  purpose
====  ===================  =====================  ==================================================
1     2(p-1-r)             F0                     fill the way down the V
2     r+1                  F0 F1                  reach the bottom and start back up
3     p-1-r                I1 W F1                first chunk-1 backwards, weight half at once
4     m-2p+r+1             F0&B1  F1&B0           steady state (the last rank runs its first
                                                  F0, B1 apart)
5     p-1-r                B1  F1&B0              forwards of chunk 1 run out
6     r+1                  B1 B0                  drain; the second half of these backwards is
                                                  split, its weight halves queued
7     p-1-r                W I0                   weight gradients fill the cool-down
8     r+1                  W                      the queue empties
====  ===================  =====================  ==================================================

The counts add up to m forwards and m backwards per chunk. This is an order built from the
published description of the schedule (DeepSeek's DualPipe README and paper), written here as data.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List

from .errors import ScheduleError
from .meta_step import MetaStep, MetaStepType as T


def dualpipev_compute_order(pp_size: int, micro_batch_num: int, overlap: bool = True) -> Dict[int, List[MetaStep]]:
    """DualPipeV's compute order per rank (see the module doc); stage ``r`` and ``2p-1-r`` on
    rank ``r``. ``overlap=False`` runs every overlapped unit as its forward, then its backward
    (what a runtime without an overlapped kernel executes)."""
    p, m = pp_size, micro_batch_num
    for name, value in (("pp_size", p), ("micro_batch_num", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError("input", f"dualpipev_compute_order: {name}={value!r} must be a positive integer")
    if m < 2 * p:
        raise ScheduleError("input", f"DualPipeV: micro_batch_num={m} must be >= 2 * pp_size = {2 * p} (the warm-up "
                            f"alone admits up to 2p microbatches on rank 0); use {2 * p} or more, or zbv")
    order: Dict[int, List[MetaStep]] = {}
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        nxt = {(c, k): 0 for c in (0, 1) for k in ("F", "B")}
        weights: deque = deque()
        out: List[MetaStep] = []

        def fwd(c):
            step = MetaStep(nxt[(c, "F")], T.FWD, stage[c])
            nxt[(c, "F")] += 1
            return step

        def bwd(c, split=False):
            i = nxt[(c, "B")]
            nxt[(c, "B")] += 1
            if split:
                weights.append(MetaStep(i, T.BWD_WEIGHT, stage[c]))
                return MetaStep(i, T.BWD_INPUT, stage[c])
            return MetaStep(i, T.BWD, stage[c])

        def unit(fc, bc):
            f, b = fwd(fc), bwd(bc)
            return [MetaStep.overlapped(f, b)] if overlap else [f, b]

        out += [fwd(0) for _ in range(2 * (p - 1 - r))]                        # 1
        for _ in range(r + 1):                                                 # 2
            out += [fwd(0), fwd(1)]
        for _ in range(p - 1 - r):                                             # 3
            out.append(bwd(1, split=True))
            out += [weights.popleft(), fwd(1)]
        for i in range(m - 2 * p + r + 1):                                     # 4
            if i == 0 and r == p - 1:
                out += [fwd(0), bwd(1)]
            else:
                out += unit(0, 1)
            out += unit(1, 0)
        for _ in range(p - 1 - r):                                             # 5
            out.append(bwd(1))
            out += unit(1, 0)
        split = False
        for i in range(r + 1):                                                 # 6
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            out.append(bwd(1, split))
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            out.append(bwd(0, split))
        for _ in range(p - 1 - r):                                             # 7
            out.append(weights.popleft())
            out.append(bwd(0, split=True))
        out += [weights.popleft() for _ in range(r + 1)]                       # 8
        assert not weights and all(n == m for n in nxt.values()), (r, nxt, weights)
        order[r] = out
    return order
