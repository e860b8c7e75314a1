"""Token permutation for mixture-of-experts layers: rows to expert slots and back, static shapes.

Pure tensor math, no communication: the single-card MoE layer (``transformer/moe.py``) and the
expert-parallel kernel (``sharding/expert_parallel.py``) run the same functions, the kernel only
adds the all-to-all between :func:`dispatch` and :func:`combine`, so both give the same numbers.

A token choosing ``k`` experts makes ``k`` *rows* (row ``r`` = token ``r // k``, choice ``r % k``).
Each row gets a *slot* in a padded buffer ``(E * C, h)``: expert ``e`` owns slots
``[e * C, (e + 1) * C)`` and its rows fill them in token order. ``C`` is the capacity of one expert
for this set of tokens: ``N`` (every token, so nothing is ever dropped: dropless) or, with a capacity
factor, ``ceil(factor * N * k / E)``; a row past its expert's capacity is dropped (policy
"position": later tokens first) and contributes zero. Empty slots hold zero rows. Shapes depend
only on ``N, k, E, C``, never on the routing, so graph mode compiles one graph and every rank of an
expert-parallel group builds the same one.

Because the buffer keeps experts contiguous, ``buffer.reshape(P, (E / P) * C, h)`` is already
split by owner when ``P`` ranks hold ``E / P`` consecutive experts each: block ``p`` goes to rank ``p``.
"""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import ops


def capacity(num_tokens: int, topk: int, num_experts: int, capacity_factor=None) -> int:
    """Slots per expert for ``num_tokens`` tokens: ``num_tokens`` when dropless (``None``)."""
    if capacity_factor is None:
        return int(num_tokens)
    return max(1, min(int(num_tokens), int(math.ceil(float(capacity_factor) * num_tokens * topk / num_experts))))


def dispatch_indices(expert_of_row, num_experts: int, cap: int, topk: int):
    """For rows (token-major) with expert ids ``expert_of_row`` (R,) int32, return

    * ``slot`` (R,) int32: the row's slot in the ``(E * C)`` buffer, ``E * C`` when dropped;
    * ``source`` (E * C,) int32: the token filling each slot, ``N`` (a zero row) when empty.
    """
    rows = expert_of_row.shape[0]
    tokens = rows // topk
    total = num_experts * cap
    onehot = ops.one_hot(expert_of_row, num_experts, ops.ones((), ms.int32), ops.zeros((), ms.int32))
    position = (ops.cumsum(onehot, 0) * onehot).sum(1) - 1                  # rank within its expert
    kept = position < cap
    slot = ops.select(kept, expert_of_row * cap + position, ops.fill(ms.int32, (rows,), total))
    # slot -> row: kept rows sorted by slot fill each expert's first min(count, C) slots
    _, order = ops.sort(slot.astype(ms.float32))
    order = order.astype(ms.int32)
    count = ops.minimum(onehot.sum(0), ops.fill(ms.int32, (num_experts,), cap))   # kept rows per expert
    start = ops.cumsum(count, 0) - count
    slot_ids = ops.arange(total, dtype=ms.int32)
    slot_expert = slot_ids // cap
    slot_pos = slot_ids - slot_expert * cap
    filled = slot_pos < ops.gather(count, slot_expert, 0)
    where = ops.minimum(ops.gather(start, slot_expert, 0) + slot_pos, ops.fill(ms.int32, (total,), rows - 1))
    source = ops.select(filled, ops.gather(order, where, 0) // topk, ops.fill(ms.int32, (total,), tokens))
    return slot, source


def dispatch(x, source):
    """``x`` (N, h) -> the padded buffer (E * C, h): slot ``j`` holds token ``source[j]`` (zeros if N)."""
    padded = ops.concat((x, ops.zeros((1, x.shape[1]), x.dtype)), 0)
    return ops.gather(padded, source, 0)


def combine(buffer, slot, probs):
    """Expert outputs in slot order (E * C, h) -> tokens (N, h): each token's rows weighted by
    ``probs`` (N, k) and summed; a dropped row (slot E * C) adds zero."""
    n, k = probs.shape
    padded = ops.concat((buffer, ops.zeros((1, buffer.shape[1]), buffer.dtype)), 0)
    rows = ops.gather(padded, slot, 0).reshape(n, k, -1)
    return (rows * ops.expand_dims(probs.astype(rows.dtype), -1)).sum(1)


def swiglu_experts(buffer, w_gate, w_up, w_down):
    """``(silu(x W_gate) * (x W_up)) W_down`` per expert on a (E_local, C', h) buffer."""
    return ops.bmm(ops.silu(ops.bmm(buffer, w_gate)) * ops.bmm(buffer, w_up), w_down)
