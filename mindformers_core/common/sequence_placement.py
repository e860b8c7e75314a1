"""Where each token lives under context parallelism, and which attention blocks a rank computes.

Pure Python/NumPy (no MindSpore): the MindSpore kernel (``sharding/context_parallel.py``), the
transformer (rotary tables, causal mask), the trainer's input slicing and the NumPy model of the
kernel below all read the same functions, so they cannot disagree.

Methods (MindFormers' names for ``context_parallel_algo``):

* ``colossal`` (ring attention): the ``cp`` ranks form one ring; K/V blocks travel around it.
* ``ulysses``: all-to-all from sequence-split to head-split, plain attention, all-to-all back.
* ``hybrid``: Ulysses inside groups of ``ulysses_degree_in_cp`` consecutive cp ranks, a ring of
  ``cp / ulysses_degree_in_cp`` members across the groups.

**Storage order.** The model's sequence dim is split *contiguously* over ``cp`` (layout
``("dp", "cp")`` on ``(b, s)``). With causal load balancing, the global sequence is first put in
*storage order*: cut into ``2 * ring`` chunks, ring member ``r`` stores chunks ``r`` and
``2 * ring - 1 - r`` (the "zigzag": every member gets one early and one late chunk, so every rank
does the same causal work). ``storage_positions`` gives, for each storage slot, the token's true
global position: rotary tables and the causal mask are built from it, and inputs/labels are
permuted with it (``to_storage_order``). The mean loss does not depend on the order.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

ALGORITHMS = ("colossal", "ulysses", "hybrid")
ALIASES = {"colossal": "colossal", "ring": "colossal", "ring_attention": "colossal",
           "ulysses": "ulysses", "hybrid": "hybrid"}

# block kinds of one ring step (see ``ring_schedule``)
CAUSAL, FULL, KV_HEAD, Q_TAIL, SKIP = 0, 1, 2, 3, 4
KIND_NAMES = {CAUSAL: "causal", FULL: "full", KV_HEAD: "kv_head", Q_TAIL: "q_tail", SKIP: "skip"}


def normalize_algorithm(name: Optional[str]) -> str:
    """``colossal`` (also ``ring``), ``ulysses`` or ``hybrid``; None means ``colossal``."""
    if name is None:
        return "colossal"
    key = str(name).strip().lower()
    if key not in ALIASES:
        raise ValueError(f"context_parallel_algo={name!r}: valid values are {list(ALGORITHMS)} "
                         f"(MindFormers' names; 'ring' is accepted for 'colossal')")
    return ALIASES[key]


def degrees(cp: int, algorithm: str = "colossal", ulysses_degree: Optional[int] = None) -> Tuple[int, int]:
    """``(ring_size, ulysses_size)`` with ``ring_size * ulysses_size == cp``."""
    algorithm = normalize_algorithm(algorithm)
    if algorithm == "colossal":
        return cp, 1
    if algorithm == "ulysses":
        return 1, cp
    u = ulysses_degree
    if u is None or not isinstance(u, int) or isinstance(u, bool) or u < 1 or cp % u:
        raise ValueError(f"ulysses_degree_in_cp={u!r}: hybrid context parallelism needs an integer that "
                         f"divides context_parallel = {cp} (Ulysses inside groups of that many ranks, a ring "
                         f"of context_parallel / ulysses_degree_in_cp across them)")
    return cp // u, u


def problems(seq_length: int, cp: int, heads: int, query_groups: int, tp: int = 1,
             algorithm: str = "colossal", ulysses_degree: Optional[int] = None,
             load_balance: bool = True) -> List[Tuple[str, object, str]]:
    """Every ``(field, value, rule)`` a context-parallel setting breaks (empty when valid)."""
    out = []
    try:
        algorithm = normalize_algorithm(algorithm)
        ring, u = degrees(cp, algorithm, ulysses_degree)
    except ValueError as e:
        field = "ulysses_degree_in_cp" if "ulysses_degree_in_cp" in str(e).split(":")[0] else "context_parallel_algo"
        value = ulysses_degree if field == "ulysses_degree_in_cp" else algorithm
        return [(field, value, str(e).split(": ", 1)[1])]
    if cp == 1:
        return out
    if seq_length % cp:
        out.append(("seq_length", seq_length, f"must be divisible by context_parallel = {cp}"))
    elif load_balance and ring > 1 and seq_length % (2 * cp):
        out.append(("seq_length", seq_length, f"must be divisible by 2 x context_parallel = {2 * cp} for the "
                    f"load-balanced causal ring (each rank holds chunks i and 2*ring-1-i); or set "
                    f"context_parallel_load_balance: false"))
    if u > 1:
        local_heads = heads // tp if heads % tp == 0 else heads
        if local_heads % u:
            out.append(("num_attention_heads", heads, f"must be divisible by the Ulysses degree {u} "
                        f"(x tensor parallel {tp}): Ulysses splits each rank's heads over its group"))
    return out


def storage_positions(seq_length: int, cp: int = 1, algorithm: str = "colossal",
                      ulysses_degree: Optional[int] = None, load_balance: bool = True) -> np.ndarray:
    """Global position of the token in each storage slot (identity without balancing or cp)."""
    ring, _ = degrees(cp, algorithm, ulysses_degree)
    if ring == 1 or not load_balance:
        return np.arange(seq_length)
    if seq_length % (2 * ring):
        raise ValueError(f"seq_length={seq_length} must be divisible by 2 x ring size = {2 * ring} for the "
                         f"load-balanced causal ring")
    chunk = seq_length // (2 * ring)
    order = []
    for r in range(ring):
        order += [r, 2 * ring - 1 - r]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in order])


def to_storage_order(x, positions: Sequence[int], axis: int = 1):
    """``x`` with its sequence dim (``axis``) permuted into storage order."""
    return np.take(np.asarray(x), np.asarray(positions), axis=axis)


def from_storage_order(x, positions: Sequence[int], axis: int = 1):
    """Inverse of :func:`to_storage_order`."""
    return np.take(np.asarray(x), np.argsort(np.asarray(positions)), axis=axis)


def causal_mask_array(positions: Sequence[int], mask_value: float = -1.0e9) -> np.ndarray:
    """Additive float32 (len, len) mask: ``mask_value`` where the key is later than the query."""
    p = np.asarray(positions)
    return np.where(p[None, :] > p[:, None], np.float32(mask_value), np.float32(0.0)).astype(np.float32)


def ring_schedule(ring: int, member: int, load_balance: bool = True) -> List[Tuple[int, int]]:
    """``[(source member, kind)]`` for steps ``t = 0..ring-1``: at step ``t`` this member holds the
    K/V of member ``(member - t) % ring``. Kinds:

    * ``CAUSAL`` (step 0, own K/V): the causal mask of this member's own tokens;
    * ``FULL``: every query attends every key (an earlier chunk, no mask);
    * ``KV_HEAD`` (balanced, source earlier in the ring): all queries x the first half of the
      keys (the source's early chunk); its late chunk is after both of ours: skipped;
    * ``Q_TAIL`` (balanced, source later): our late chunk x all the source's keys; our early
      chunk precedes both of its chunks: skipped;
    * ``SKIP`` (unbalanced, source later): nothing is computed.
    With balancing every step after the first costs half a block on every member.
    """
    out = []
    for t in range(ring):
        src = (member - t) % ring
        if t == 0:
            kind = CAUSAL
        elif load_balance:
            kind = KV_HEAD if src < member else Q_TAIL
        else:
            kind = FULL if src < member else SKIP
        out.append((src, kind))
    return out


def local_causal_positions(seq_local: int, ring: int, load_balance: bool = True) -> np.ndarray:
    """Positions (relative pattern) of a ring member's own tokens: enough to build the step-0 mask,
    which is the same on every member (early chunk causal, late chunk sees the early one whole)."""
    if ring == 1 or not load_balance:
        return np.arange(seq_local)
    half = seq_local // 2
    return np.concatenate([np.arange(half), seq_local + np.arange(half)])


# ----------------------------------------------------------------------------- NumPy model

def block_attention_numpy(q, k, v, mask=None):
    """One block: ``(out, lse)`` with ``out = softmax(q k^T + mask) v`` over this block's keys and
    ``lse`` the row log-sum-exp (``-inf`` and zero output for rows with every key masked).
    q (..., sq, d), k/v (..., sk, d); mask additive, ``-inf`` for masked."""
    s = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = s + mask
    m = s.max(axis=-1, keepdims=True)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - safe_m)
    l = e.sum(axis=-1, keepdims=True)
    lse = np.where(l > 0, safe_m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    out = np.where(l > 0, (e / np.where(l > 0, l, 1.0)) @ v, 0.0)
    return out, lse


def merge_blocks_numpy(o_a, lse_a, o_b, lse_b):
    """Online-softmax combination of two blocks over disjoint key sets (``-inf`` lse = empty)."""
    m = np.maximum(lse_a, lse_b)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    wa, wb = np.exp(lse_a - safe_m), np.exp(lse_b - safe_m)
    total = wa + wb
    lse = np.where(total > 0, safe_m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    denom = np.where(total > 0, total, 1.0)
    return (o_a * wa + o_b * wb) / denom, lse


def ring_attention_numpy(q, k, v, cp: int, load_balance: bool = True, scale: float = 1.0):
    """Causal attention of full-sequence q/k/v (..., s, d) *in storage order*, computed as the ring
    kernel does: per member, step-0 causal block, then the scheduled (half) blocks merged online.
    Returns the full output in storage order (compare with plain masked softmax)."""
    n = q.shape[-2] // cp
    half = n // 2
    q = q * scale
    outs = []
    for i in range(cp):
        qi = q[..., i * n:(i + 1) * n, :]
        o = lse = None
        for src, kind in ring_schedule(cp, i, load_balance):
            kj, vj = k[..., src * n:(src + 1) * n, :], v[..., src * n:(src + 1) * n, :]
            if kind == SKIP:
                continue
            if kind == CAUSAL:
                local = local_causal_positions(n, cp, load_balance)
                mask = np.where(local[None, :] > local[:, None], -np.inf, 0.0)
                o, lse = block_attention_numpy(qi, kj, vj, mask)
            elif kind == FULL:
                o, lse = merge_blocks_numpy(o, lse, *block_attention_numpy(qi, kj, vj))
            elif kind == KV_HEAD:
                o, lse = merge_blocks_numpy(o, lse, *block_attention_numpy(qi, kj[..., :half, :], vj[..., :half, :]))
            else:  # Q_TAIL
                ob, lb = block_attention_numpy(qi[..., half:, :], kj, vj)
                ot, lt = merge_blocks_numpy(o[..., half:, :], lse[..., half:, :], ob, lb)
                o = np.concatenate([o[..., :half, :], ot], axis=-2)
                lse = np.concatenate([lse[..., :half, :], lt], axis=-2)
        outs.append(o)
    return np.concatenate(outs, axis=-2)
