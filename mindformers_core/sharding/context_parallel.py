"""Context-parallel attention kernels: ring attention ("colossal"), Ulysses and hybrid.

``parallelize`` swaps an attention Cell (``sharding_op = "scaled_dot_product_attention"``) for
:class:`ContextParallelAttention` when the plan splits the sequence over ``cp``. The model code
stays single-card; the collectives live here.

Ring (:class:`RingAttentionCore`): each ring member holds Q/K/V of its own tokens (storage
order, see ``common/sequence_placement.py``). Forward: step 0 attends its own keys with the causal
mask; then ``ring - 1`` times the packed K/V block moves one member along the ring (send to the
next, receive from the previous) and the scheduled (half) block is attended; partial results are
merged with the online log-sum-exp softmax. Backward (``bprop``, the same in PyNative and jit):
the packed ``(K, V, dK, dV)`` travels the ring again, each member adds the gradient of its queries'
block to the travelling dK/dV, and a last hop returns dK/dV to their owners. No rank ever holds
more than its own block plus one travelling block.

Point to point: even ring members send then receive, odd members receive then send (no
deadlock with blocking send/recv; on CPU each hop is the two-rank AllReduce of ``comm.kernels``).
Consecutive hops are chained by data (``KeepAlive``) so graph mode keeps them in order.

Ulysses (:class:`ContextParallelAttention` with ``ulysses_group``): all-to-all within the group
turns sequence-split Q/K/V into head-split full-group sequences, the ring core runs (a ring of one
member is plain causal attention) and the output goes back with the inverse all-to-all. Hybrid is
the same with a ring of several members across the Ulysses groups.
"""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import Tensor, nn, ops

from ..common.sequence_placement import (CAUSAL, FULL, KV_HEAD, causal_mask_array, degrees,
                                         local_causal_positions, ring_schedule)
from ..distributed.comm import kernels as K
from ..distributed.comm.autograd import Differentiable
from ..distributed.comm.kernels import CommCell
from ..distributed.process_group import ProcessGroup, new_group, world_group

MASK_VALUE = -1.0e9


RING_TAG = "cp_ring"


def ring_pair_groups(ring: ProcessGroup):
    """This member's two-rank ring groups, created in one global order (member pairs (m, m+1) by m)
    so that no two ranks wait on each other's creation."""
    out = {}
    n = ring.size
    for m in range(n):
        pair = tuple(sorted((ring.ranks[m], ring.ranks[(m + 1) % n])))
        if ring.rank in pair and pair not in out:
            out[pair] = new_group(pair, tag=RING_TAG)
    return out


class RingShift(CommCell):
    """Receive the previous ring member's tensor while sending ours to the next member.

    The hops run on their own communicators (groups tagged ``cp_ring``), so graph mode may order
    them freely against the other collectives of the step (loss and gradient reductions over the
    same ranks). On CPU: a ring of two swaps through one AllReduce of a two-slot buffer (the same
    graph on both members); longer rings use two-rank AllReduces, even members sending first."""

    def __init__(self, ring: ProcessGroup, shape, dtype):
        super().__init__()
        self.n = ring.size
        self.mode = "identity"
        if self.n == 1:
            return
        i = ring.local_rank
        nxt, prv = ring.ranks[(i + 1) % self.n], ring.ranks[(i - 1) % self.n]
        self.keep = K.KeepAlive()
        self.send_first = i % 2 == 0
        world = world_group()
        if K.is_native("send", world):
            self.mode = "native"
            self.send = K.SendKernel(world, nxt)
            self.recv = K.RecvKernel(world, prv, shape, dtype)
        elif self.n == 2:
            self.mode = "swap"
            self.reduce = K._SumAllReduce(new_group(sorted(ring.ranks), tag=RING_TAG))
            self.flags = K.rank_flags(2, i)
        else:
            self.mode = "pairs"
            pairs = ring_pair_groups(ring)
            to_next = pairs[tuple(sorted((ring.rank, nxt)))]
            from_prev = pairs[tuple(sorted((ring.rank, prv)))]
            # the same graph on every member: first hop, then second; even members send first
            first, second = (to_next, from_prev) if self.send_first else (from_prev, to_next)
            self.first = K._SumAllReduce(first)
            self.second = K._SumAllReduce(second)
            self.sends_first = K.role_flag(self.send_first)

    def construct(self, x):
        if self.mode == "identity":
            return x
        if self.mode == "swap":
            flags = self.flags.reshape((2,) + (1,) * x.ndim)
            stacked = ops.broadcast_to(ops.expand_dims(x, 0), (2,) + x.shape)
            zeros = ops.zeros_like(stacked)
            slots = self.reduce(ops.select(flags, stacked, zeros))
            return ops.select(flags, zeros, slots).sum(0)      # the other member's slot, exactly
        if self.mode == "native":
            if self.send_first:
                token = self.send(x)
                return self.recv(self.keep(x, token))
            got = self.recv(x)
            token = self.send(self.keep(x, got))
            return self.keep(got, token)
        # the receiver contributes zeros; KeepAlive (not zeros_like of a dependent value, which the
        # optimizer may fold) orders the hop after the previous one
        zeros = ops.zeros_like(x)
        f = self.sends_first
        a = self.first(_pick(f, x, self.keep(zeros, x)))
        b = self.second(self.keep(_pick(f, zeros, x), a))
        return self.keep(_pick(f, b, a), _pick(f, a, b))


def _split_last(x, parts):
    size = x.shape[-1] // parts
    return tuple(x[..., j * size:(j + 1) * size] for j in range(parts))


def _rep(x, repeat):
    if repeat > 1:
        return ops.repeat_interleave(x, repeat, 1)
    return x


def _unrep(x, groups, repeat):
    if repeat > 1:
        b, _, s, d = x.shape
        return x.reshape(b, groups, repeat, s, d).sum(2)
    return x


def _block(q, k, v, mask, scale, repeat):
    """``(out, lse)`` of q over one key block (float32); ``mask`` additive or None."""
    s = ops.matmul(q, ops.transpose(_rep(k, repeat), (0, 1, 3, 2))) * scale
    if mask is not None:
        s = s + mask
    m = s.max(axis=-1, keepdims=True)
    e = ops.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    return ops.matmul(e / l, _rep(v, repeat)), m + ops.log(l)


def _merge(o, lse, ob, lb):
    """Online softmax: combine two partial results over disjoint key sets."""
    m = ops.maximum(lse, lb)
    wa = ops.exp(lse - m)
    wb = ops.exp(lb - m)
    total = wa + wb
    return (o * wa + ob * wb) / total, m + ops.log(total)


def _block_grad(q, k, v, lse, do, dd, mask, scale, groups, repeat):
    """dq, dk, dv of one block given the final row lse and ``dd = rowsum(do * out)``."""
    kr, vr = _rep(k, repeat), _rep(v, repeat)
    s = ops.matmul(q, ops.transpose(kr, (0, 1, 3, 2))) * scale
    if mask is not None:
        s = s + mask
    p = ops.exp(s - lse)
    dv = ops.matmul(ops.transpose(p, (0, 1, 3, 2)), do)
    dp = ops.matmul(do, ops.transpose(vr, (0, 1, 3, 2)))
    ds = p * (dp - dd) * scale
    dq = ops.matmul(ds, kr)
    dk = ops.matmul(ops.transpose(ds, (0, 1, 3, 2)), q)
    return dq, _unrep(dk, groups, repeat), _unrep(dv, groups, repeat)


def _halves(x, h):
    return x[:, :, :h], x[:, :, h:]


def _pick(flag, a, b):
    """``a`` where the rank's flag is set, else ``b`` (same graph on every rank)."""
    return ops.select(flag.reshape((1,) * a.ndim), a, b)


class _ForwardStep(CommCell):
    """One ring step after the first: receive the next K/V block, attend what the schedule says.

    Every rank compiles the same graph (graph mode orders independent collectives by graph shape:
    rank-shaped graphs reorder the gradient reductions); the rank's kind is a flag Parameter.
    Balanced: KV_HEAD (all q x early keys) and Q_TAIL (late q x all keys) share the sub-block
    (late q x early keys) and differ in one more half-sized sub-block, chosen by the flag: two of
    the four (h x h) sub-blocks are computed, the other two are really skipped. Unbalanced: the
    full block is computed and merged only where the flag says FULL (PyNative would skip it; one
    graph for every rank is worth more here)."""

    def __init__(self, kind, balanced, shift, half, scale, repeat):
        super().__init__()
        self.balanced, self.shift, self.half, self.scale, self.repeat = balanced, shift, half, scale, repeat
        self.flag = K.role_flag(kind in (KV_HEAD, FULL))

    def construct(self, q, o, lse, kv):
        kv = self.shift(kv)
        kt, vt = _split_last(kv, 2)
        f = self.flag
        if not self.balanced:
            ob, lb = _block(q, kt, vt, None, self.scale, self.repeat)
            om, lm = _merge(o, lse, ob, lb)
            return _pick(f, om, o), _pick(f, lm, lse), kv
        h = self.half
        q_head, q_tail = q[:, :, :h], q[:, :, h:]
        k_head, k_tail, v_head, v_tail = kt[:, :, :h], kt[:, :, h:], vt[:, :, :h], vt[:, :, h:]
        oa, la = _block(q_tail, k_head, v_head, None, self.scale, self.repeat)
        ob, lb = _block(_pick(f, q_head, q_tail), _pick(f, k_head, k_tail), _pick(f, v_head, v_tail), None,
                        self.scale, self.repeat)
        o_head, o_tail, l_head, l_tail = o[:, :, :h], o[:, :, h:], lse[:, :, :h], lse[:, :, h:]
        mh, lmh = _merge(o_head, l_head, ob, lb)
        t1, lt1 = _merge(o_tail, l_tail, oa, la)
        t2, lt2 = _merge(t1, lt1, ob, lb)
        o = ops.concat((_pick(f, mh, o_head), _pick(f, t1, t2)), 2)
        lse = ops.concat((_pick(f, lmh, l_head), _pick(f, lt1, lt2)), 2)
        return o, lse, kv


class _BackwardStep(CommCell):
    """One backward ring step: (hop, then) add this member's block gradients to the travelling dK/dV.
    The same sub-blocks as :class:`_ForwardStep`, selected by the same flag."""

    def __init__(self, kind, balanced, shift, half, mask, scale, groups, repeat):
        super().__init__()
        self.shift, self.half, self.mask = shift, half, mask
        self.scale, self.groups, self.repeat = scale, groups, repeat
        self.causal = kind == CAUSAL        # step 0: own K/V, causal mask, no hop
        self.balanced = balanced
        self.flag = K.role_flag(kind in (KV_HEAD, FULL))

    def construct(self, q, lse, do, dd, dq, kvd):
        if not self.causal:
            kvd = self.shift(kvd)
        kt, vt, dkt, dvt = _split_last(kvd, 4)
        f = self.flag
        if self.causal:
            gq, gk, gv = _block_grad(q, kt, vt, lse, do, dd, self.mask, self.scale, self.groups, self.repeat)
            return dq + gq, ops.concat((kt, vt, dkt + gk, dvt + gv), -1)
        if not self.balanced:
            gq, gk, gv = _block_grad(q, kt, vt, lse, do, dd, None, self.scale, self.groups, self.repeat)
            zq, zk = ops.zeros_like(gq), ops.zeros_like(gk)
            return dq + _pick(f, gq, zq), ops.concat((kt, vt, dkt + _pick(f, gk, zk), dvt + _pick(f, gv, zk)), -1)
        h = self.half
        q_head, q_tail = _halves(q, h)
        k_head, k_tail = _halves(kt, h)
        v_head, v_tail = _halves(vt, h)
        l_head, l_tail = _halves(lse, h)
        do_head, do_tail = _halves(do, h)
        dd_head, dd_tail = _halves(dd, h)
        gqa, gka, gva = _block_grad(q_tail, k_head, v_head, l_tail, do_tail, dd_tail, None, self.scale,
                                    self.groups, self.repeat)
        gqb, gkb, gvb = _block_grad(_pick(f, q_head, q_tail), _pick(f, k_head, k_tail), _pick(f, v_head, v_tail),
                                    _pick(f, l_head, l_tail), _pick(f, do_head, do_tail), _pick(f, dd_head, dd_tail),
                                    None, self.scale, self.groups, self.repeat)
        zq, zk = ops.zeros_like(gqb), ops.zeros_like(gkb)
        dq_head, dq_tail = _halves(dq, h)
        dk_head, dk_tail = _halves(dkt, h)
        dv_head, dv_tail = _halves(dvt, h)
        dq = ops.concat((dq_head + _pick(f, gqb, zq), dq_tail + gqa + _pick(f, zq, gqb)), 2)
        dkt = ops.concat((dk_head + gka + _pick(f, gkb, zk), dk_tail + _pick(f, zk, gkb)), 2)
        dvt = ops.concat((dv_head + gva + _pick(f, gvb, zk), dv_tail + _pick(f, zk, gvb)), 2)
        return dq, ops.concat((kt, vt, dkt, dvt), -1)


class RingAttentionCore(CommCell):
    """Causal attention for local q (b, n, s, d), k/v (b, g, s, d) over the ring: returns
    ``concat(out, lse)`` (b, n, s, d + 1); the row log-sum-exp rides along for the custom backward
    (one output tensor for ``bprop``); callers keep ``[..., :d]``.

    The schedule is per member (``ring_schedule``); each step is its own Cell (graph mode unrolls
    the step list into straight-line code) whose kind is a flag Parameter, so every member
    compiles the same graph."""

    def __init__(self, ring: ProcessGroup, shape_q, shape_kv, scale: float, load_balance: bool = True):
        super().__init__()
        b, n, s, d = shape_q
        g = shape_kv[1]
        self.repeat = n // g
        self.scale = float(scale)
        self.ring = ring.size
        balanced = load_balance and self.ring > 1
        if balanced and s % 2:
            raise ValueError(f"ring attention: the local sequence {s} must be even for the load-balanced causal "
                             f"ring (two chunks per rank)")
        half = s // 2
        self.kinds = tuple(kind for _, kind in ring_schedule(self.ring, ring.local_rank, balanced))
        self.mask = Tensor(causal_mask_array(local_causal_positions(s, self.ring, balanced), MASK_VALUE))
        self.shift_kv = RingShift(ring, (b, g, s, 2 * d), ms.float32)
        shift_all = RingShift(ring, (b, g, s, 4 * d), ms.float32)
        self.forward_steps = nn.CellList([_ForwardStep(k, balanced, self.shift_kv, half, self.scale, self.repeat)
                                          for k in self.kinds[1:]], auto_prefix=False)
        self.backward_steps = nn.CellList([_BackwardStep(k, balanced, shift_all, half, self.mask, self.scale, g,
                                                         self.repeat) for k in self.kinds], auto_prefix=False)
        self.keep = K.KeepAlive()

    def construct(self, q, k, v):
        kv = ops.concat((k, v), -1)
        o, lse = _block(q, k, v, self.mask, self.scale, self.repeat)
        for step in self.forward_steps:
            o, lse, kv = step(q, o, lse, kv)
        return ops.concat((o, lse), -1)

    def bprop(self, q, k, v, out, dout):
        d = q.shape[-1]
        o, lse = out[..., :d], out[..., d:]
        do = dout[..., :d]
        dd = (do * o).sum(axis=-1, keepdims=True)
        # start after the forward has finished with its hops (dout depends on all of them)
        kvd = self.keep(ops.concat((k, v, ops.zeros_like(k), ops.zeros_like(v)), -1), do)
        dq = ops.zeros_like(q)
        for step in self.backward_steps:
            dq, kvd = step(q, lse, do, dd, dq, kvd)
        dkv = _split_last(kvd, 2)[1]             # (dK, dV) of the block this member holds now
        if self.ring > 1:
            dkv = self.shift_kv(dkv)             # the last hop brings each member its own dK/dV
        dk, dv = _split_last(dkv, 2)
        return dq, dk, dv


class ContextParallelAttention(CommCell):
    """Drop-in for a causal attention Cell: q (b, n, s_local, d), k/v (b, g, s_local, d) ->
    (b, s_local, n * d), the sequence split over the cp ranks in storage order.

    ``ulysses_group`` of size ``u > 1``: all-to-all to head-split full-group sequences first
    (``n / u`` heads; key/value heads are repeated to ``n`` first when ``g`` is not divisible by
    ``u``); ``ring_group`` of size ``r``: ring attention across. ``u * r`` = the cp size."""

    mfc_replaces_inner = True

    def __init__(self, inner: nn.Cell, ring_group: ProcessGroup, ulysses_group: ProcessGroup,
                 shape_q, shape_kv, scale: float, load_balance: bool = True):
        super().__init__()
        self.inner = inner   # the replaced single-card Cell (no parameters; kept for the model tree)
        b, n, s, d = shape_q
        g = shape_kv[1]
        self.head_dim = d
        self.u = ulysses_group.size
        if n % self.u:
            raise ValueError(f"Ulysses context parallelism: {n} attention heads on this rank are not divisible "
                             f"by the Ulysses degree {self.u}; choose num_attention_heads divisible by "
                             f"ulysses degree x tensor parallel, or context_parallel_algo: colossal")
        self.pre_repeat = 1
        if self.u > 1 and g % self.u:
            self.pre_repeat = n // g
            g = n
        if self.u > 1:
            self.a2a_in = Differentiable(K.AllToAllKernel(ulysses_group, 1, 2), K.AllToAllKernel(ulysses_group, 2, 1))
            self.a2a_out = Differentiable(K.AllToAllKernel(ulysses_group, 2, 1), K.AllToAllKernel(ulysses_group, 1, 2))
        self.core = RingAttentionCore(ring_group, (b, n // self.u, s * self.u, d), (b, g // self.u, s * self.u, d),
                                      scale, load_balance)
        self.compute_dtype = getattr(inner, "compute_dtype", ms.float32)
        self.low_precision = self.compute_dtype != ms.float32

    def construct(self, q, k, v):
        b, s = q.shape[0], q.shape[2]
        if self.low_precision:
            q, k, v = ops.cast(q, ms.float32), ops.cast(k, ms.float32), ops.cast(v, ms.float32)
        if self.pre_repeat > 1:
            k = ops.repeat_interleave(k, self.pre_repeat, 1)
            v = ops.repeat_interleave(v, self.pre_repeat, 1)
        if self.u > 1:
            q, k, v = self.a2a_in(q), self.a2a_in(k), self.a2a_in(v)
        o = self.core(q, k, v)[..., :self.head_dim]
        if self.u > 1:
            o = self.a2a_out(o)
        if self.low_precision:
            o = ops.cast(o, self.compute_dtype)
        return ops.transpose(o, (0, 2, 1, 3)).reshape(b, s, -1)


def cp_groups(mesh, seq_axes, algorithm: str, ulysses_degree, rank: int):
    """(ring_group, ulysses_group) of ``rank`` for the cp axes of ``mesh`` (a DeviceMesh): the cp
    group's members ``c = r * u + j`` form Ulysses groups of consecutive ``j`` and rings of equal ``j``."""
    cp_group = mesh.get_group(tuple(seq_axes))
    cp = cp_group.size
    ring, u = degrees(cp, algorithm, ulysses_degree)
    c = cp_group.local_rank
    r, j = divmod(c, u)
    ranks = cp_group.ranks
    ulysses = new_group([ranks[r * u + x] for x in range(u)])
    ring_g = new_group([ranks[y * u + j] for y in range(ring)])
    return ring_g, ulysses


def attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
