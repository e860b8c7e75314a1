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
Consecutive hops are chained by data (``_keep``) so graph mode keeps them in order.

Rank flags are data, never Python branches (every rank compiles the same graph), and they reach
the kernel as an *argument* (:class:`RingAttentionCore` holds them in a non-trainable Parameter
and passes them to :class:`_RingAttention`): MindSpore 2.10 refuses a Cell ``bprop`` that reads a
Parameter when the graph holding it is differentiated from PyNative ("The user defined 'bprop'
function ... does not support using Parameter"; hsdp level3 islands, jit pipeline stages), while
an input of the Cell is fine in every mode.

Ulysses (:class:`ContextParallelAttention` with ``ulysses_group``): all-to-all within the group
turns sequence-split Q/K/V into head-split full-group sequences, the ring core runs (a ring of one
member is plain causal attention) and the output goes back with the inverse all-to-all. Hybrid is
the same with a ring of several members across the Ulysses groups.
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from ..common.sequence_placement import (CAUSAL, FULL, KV_HEAD, causal_mask_array, degrees,
                                         local_causal_positions, ring_schedule)
from ..distributed.comm import exchange as _exchange
from ..distributed.comm import kernels as K
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


# the ring's flag vector (float32, one per RingAttentionCore): what each rank does is data
OFF, SWAP, SENDS_FIRST, STEPS = 0, 1, 3, 4


def _flag(flags, i):
    """Flag ``i`` of the flag vector as a bool ``(1,)`` tensor."""
    return flags[i:i + 1] > 0.5


def _keep(value, dep, flags):
    """``value`` unchanged, but data-dependent on ``dep`` (``KeepAlive`` with the flag passed in):
    graph mode can neither prune ``dep`` nor reorder the hop producing it."""
    first = dep.reshape(-1)[0:1].astype(value.dtype)
    picked = ops.select(_flag(flags, OFF), first, ops.zeros((1,), value.dtype))
    return value + picked.sum()


def ring_flag_values(ring_size: int, index: int, kinds) -> "np.ndarray":
    """The flag vector of ring member ``index``: OFF (always 0), the two-member swap's one-hot slot,
    whether it sends first, and per schedule step whether the step's kind is KV_HEAD/FULL."""
    values = np.zeros((STEPS + len(kinds),), np.float32)
    if ring_size == 2:
        values[SWAP + index] = 1.0
    values[SENDS_FIRST] = float(index % 2 == 0)
    for j, kind in enumerate(kinds):
        values[STEPS + j] = float(kind in (KV_HEAD, FULL))
    return values


class RingShift(CommCell):
    """Receive the previous ring member's tensor while sending ours to the next member:
    ``construct(x, flags)`` with the ring's flag vector (see :func:`ring_flag_values`).

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
        self.send_first = i % 2 == 0
        world = world_group()
        if K.is_native("send", world):
            self.mode = "native"
            self.send = K.SendKernel(world, nxt)
            self.recv = K.RecvKernel(world, prv, shape, dtype)
        elif self.n == 2:
            self.mode = "swap"
            self.reduce = K._SumAllReduce(new_group(sorted(ring.ranks), tag=RING_TAG))
        else:
            self.mode = "pairs"
            pairs = ring_pair_groups(ring)
            to_next = pairs[tuple(sorted((ring.rank, nxt)))]
            from_prev = pairs[tuple(sorted((ring.rank, prv)))]
            # the same graph on every member: first hop, then second; even members send first
            first, second = (to_next, from_prev) if self.send_first else (from_prev, to_next)
            self.first = K._SumAllReduce(first)
            self.second = K._SumAllReduce(second)

    def construct(self, x, flags):
        if self.mode == "identity":
            return x
        if self.mode == "swap":
            slots = (flags[SWAP:SWAP + 2] > 0.5).reshape((2,) + (1,) * x.ndim)
            stacked = ops.broadcast_to(ops.expand_dims(x, 0), (2,) + x.shape)
            zeros = ops.zeros_like(stacked)
            summed = self.reduce(ops.select(slots, stacked, zeros))
            return ops.select(slots, zeros, summed).sum(0)      # the other member's slot, exactly
        if self.mode == "native":
            if self.send_first:
                token = self.send(x)
                return self.recv(_keep(x, token, flags))
            got = self.recv(x)
            token = self.send(_keep(x, got, flags))
            return _keep(got, token, flags)
        # the receiver contributes zeros; _keep (not zeros_like of a dependent value, which the
        # optimizer may fold) orders the hop after the previous one
        zeros = ops.zeros_like(x)
        f = _flag(flags, SENDS_FIRST)
        a = self.first(_pick(f, x, _keep(zeros, x, flags)))
        b = self.second(_keep(_pick(f, zeros, x), a, flags))
        return _keep(_pick(f, b, a), _pick(f, a, b), flags)


def _split_last(x, parts):
    size = x.shape[-1] // parts
    return tuple(x[..., j * size:(j + 1) * size] for j in range(parts))


def _rep(x, repeat):
    out = x
    if repeat > 1:
        out = ops.repeat_interleave(x, repeat, 1)
    return out


def _unrep(x, groups, repeat):
    out = x
    if repeat > 1:
        b, _, s, d = x.shape
        out = x.reshape(b, groups, repeat, s, d).sum(2)
    return out


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

    def __init__(self, step, balanced, shift, half, scale, repeat):
        super().__init__()
        self.balanced, self.shift, self.half, self.scale, self.repeat = balanced, shift, half, scale, repeat
        self.step = step        # index in the schedule: its flag is flags[STEPS + step]

    def construct(self, q, o, lse, kv, flags):
        kv = self.shift(kv, flags)
        kt, vt = _split_last(kv, 2)
        f = _flag(flags, STEPS + self.step)
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

    def __init__(self, kind, step, balanced, shift, half, mask, scale, groups, repeat):
        super().__init__()
        self.shift, self.half, self.mask = shift, half, mask
        self.scale, self.groups, self.repeat = scale, groups, repeat
        self.causal = kind == CAUSAL        # step 0: own K/V, causal mask, no hop
        self.balanced = balanced
        self.step = step

    def construct(self, q, lse, do, dd, dq, kvd, flags):
        if not self.causal:
            kvd = self.shift(kvd, flags)
        kt, vt, dkt, dvt = _split_last(kvd, 4)
        f = _flag(flags, STEPS + self.step)
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


class _RingAttention(CommCell):
    """The ring kernel with its flag vector as an argument: ``construct(q, k, v, flags)`` and the
    custom backward ``bprop(q, k, v, flags, out, dout)``, which reads no Parameter and shares no
    Python function with the forward (see :func:`_backward_twin`). Built and fed by
    :class:`RingAttentionCore`."""

    def __init__(self, ring: ProcessGroup, kinds, shape_q, shape_kv, scale: float, balanced: bool):
        super().__init__()
        b, n, s, d = shape_q
        g = shape_kv[1]
        self.repeat = n // g
        self.scale = float(scale)
        self.ring = ring.size
        half = s // 2
        self.mask = Tensor(causal_mask_array(local_causal_positions(s, self.ring, balanced), MASK_VALUE))
        self.shift_kv = RingShift(ring, (b, g, s, 2 * d), ms.float32)
        self.forward_steps = nn.CellList([_ForwardStep(j, balanced, self.shift_kv, half, self.scale, self.repeat)
                                          for j in range(1, len(kinds))], auto_prefix=False)
        self.backward = _backward_twin()._RingBackward(ring, kinds, shape_q, shape_kv, self.scale, balanced,
                                                       self.mask)

    def construct(self, q, k, v, flags):
        kv = ops.concat((k, v), -1)
        o, lse = _block(q, k, v, self.mask, self.scale, self.repeat)
        for step in self.forward_steps:
            o, lse, kv = step(q, o, lse, kv, flags)
        return ops.concat((o, lse), -1)

    def bprop(self, q, k, v, flags, out, dout):
        return self.backward(q, k, v, flags, out, dout)


class _RingBackward(CommCell):
    """The ring's backward as a Cell (instantiated from :func:`_backward_twin`'s copy of this
    module): the packed (K, V, dK, dV) travels the ring, each step adds this member's block
    gradients, a last hop returns dK/dV to their owners."""

    def __init__(self, ring: ProcessGroup, kinds, shape_q, shape_kv, scale: float, balanced: bool, mask):
        super().__init__()
        b, n, s, d = shape_q
        g = shape_kv[1]
        self.ring = ring.size
        self.shift_back = RingShift(ring, (b, g, s, 2 * d), ms.float32)
        shift_all = RingShift(ring, (b, g, s, 4 * d), ms.float32)
        self.steps = nn.CellList([_BackwardStep(k, j, balanced, shift_all, s // 2, mask, scale, g, n // g)
                                  for j, k in enumerate(kinds)], auto_prefix=False)

    def construct(self, q, k, v, flags, out, dout):
        d = q.shape[-1]
        o, lse = out[..., :d], out[..., d:]
        do = dout[..., :d]
        dd = (do * o).sum(axis=-1, keepdims=True)
        # start after the forward has finished with its hops (dout depends on all of them)
        kvd = _keep(ops.concat((k, v, ops.zeros_like(k), ops.zeros_like(v)), -1), do, flags)
        dq = ops.zeros_like(q)
        for step in self.steps:
            dq, kvd = step(q, lse, do, dd, dq, kvd, flags)
        dkv = _split_last(kvd, 2)[1]             # (dK, dV) of the block this member holds now
        if self.ring > 1:
            dkv = self.shift_back(dkv, flags)    # the last hop brings each member its own dK/dV
        dk, dv = _split_last(dkv, 2)
        return dq, dk, dv, ops.zeros_like(flags)


def _backward_twin():
    """A second, private instance of this module, whose Cells and functions build the backward.

    MindSpore 2.10, differentiating from PyNative a graph (``ms.jit``: an hsdp level3 island, a jit
    pipeline stage) that holds a Cell ``bprop``, fails when the bprop and the forward call the same
    Python function ("The pointer[func_graph->get_return()] is null", manager.cc MaybeDropFuncGraphs:
    the shared function's graph is dropped with one of them). The twin's functions are other objects
    with the same code, so nothing is shared."""
    return _exchange.module_twin(__name__, __file__)


class RingAttentionCore(CommCell):
    """Causal attention for local q (b, n, s, d), k/v (b, g, s, d) over the ring: returns
    ``concat(out, lse)`` (b, n, s, d + 1); the row log-sum-exp rides along for the custom backward
    (one output tensor for ``bprop``); callers keep ``[..., :d]``.

    The schedule is per member (``ring_schedule``); each step is its own Cell (graph mode unrolls
    the step list into straight-line code) whose kind is read from this member's flag vector (a
    non-trainable Parameter here, an argument of the kernel), so every member compiles the same
    graph."""

    def __init__(self, ring: ProcessGroup, shape_q, shape_kv, scale: float, load_balance: bool = True):
        super().__init__()
        s = shape_q[2]
        self.ring = ring.size
        balanced = load_balance and self.ring > 1
        if balanced and s % 2:
            raise ValueError(f"ring attention: the local sequence {s} must be even for the load-balanced causal "
                             f"ring (two chunks per rank)")
        self.kinds = tuple(kind for _, kind in ring_schedule(self.ring, ring.local_rank, balanced))
        self.flags = K._flag_parameter(ring_flag_values(self.ring, ring.local_rank, self.kinds))
        self.attend = _RingAttention(ring, self.kinds, shape_q, shape_kv, scale, balanced)
        self.shift_kv = self.attend.shift_kv

    def construct(self, q, k, v):
        return self.attend(q, k, v, self.flags)


# the Ulysses all-to-all: the equal-chunk exchange of distributed/comm/exchange.py (flags as arguments, backward
# from that module's twin). This module's twin names the twin's kernel, so that counting at ``_AllToAll`` of this
# module and of ``_backward_twin()`` (bench/cp_body.py) sees the forward and the backward exchanges once each.
_AllToAll = (_exchange.backward_twin() if __name__.endswith("_backward_twin") else _exchange).SlotAllToAll
_UlyssesExchange = _exchange.AllToAllExchange


class ContextParallelAttention(CommCell):
    """Drop-in for a causal attention Cell: q (b, n, s_local, d), k (b, g, s_local, d), v (b, g, s_local,
    dv) -> (b, s_local, n * dv), the sequence split over the cp ranks in storage order. ``shape_q`` /
    ``shape_kv`` carry the ring's head width, max(d, dv): narrower inputs are zero-padded to it.

    ``ulysses_group`` of size ``u > 1``: all-to-all to head-split full-group sequences first
    (``n / u`` heads; key/value heads are repeated to ``n`` first when ``g`` is not divisible by
    ``u``); ``ring_group`` of size ``r``: ring attention across. ``u * r`` = the cp size.

    ``masked``: the call brings an additive mask (b, 1, S, S) of the whole sequence in storage order
    (``AttentionMask`` of packed documents' position and segment ids): after the Ulysses exchange, k and v of
    the ring are all-gathered over the ring group (one exchange instead of the ring's r - 1 steps: the causal
    block skipping of the ring does not hold when any key may be masked) and each local query row attends to
    the whole sequence under its rows of the mask, so a document boundary may fall inside a cp chunk."""

    mfc_replaces_inner = True

    def __init__(self, inner: nn.Cell, ring_group: ProcessGroup, ulysses_group: ProcessGroup,
                 shape_q, shape_kv, scale: float, load_balance: bool = True, masked: bool = False):
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
            slots = np.zeros((self.u,), np.float32)
            slots[ulysses_group.local_rank] = 1.0
            self.slots = K._flag_parameter(slots)
            # one Cell per call site: a compiled unit differentiated from PyNative (hsdp level3) must
            # not reuse one custom-backward Cell for inputs of different shapes (q vs GQA k/v)
            self.a2a_q = _UlyssesExchange(ulysses_group, 1, 2)
            self.a2a_k = _UlyssesExchange(ulysses_group, 1, 2)
            self.a2a_v = _UlyssesExchange(ulysses_group, 1, 2)
            self.a2a_out = _UlyssesExchange(ulysses_group, 2, 1)
        self.masked = masked
        if masked:
            self.scale = scale
            self.ring = ring_group.size
            self.kv_repeat = (n // self.u) // (g // self.u)
            rows = np.zeros((self.ring,), np.float32)
            rows[ring_group.local_rank] = 1.0
            self.ring_rows = K._flag_parameter(rows)     # which rows of the mask this rank's queries are (data)
            from ..distributed.comm.capabilities import force_emulation
            with force_emulation():                      # differentiable in both modes (AllReduce bprop)
                self.gather_k = K.AllGatherKernel(ring_group, 0)
                self.gather_v = K.AllGatherKernel(ring_group, 0)
        else:
            self.core = RingAttentionCore(ring_group, (b, n // self.u, s * self.u, d),
                                          (b, g // self.u, s * self.u, d), scale, load_balance)
        self.compute_dtype = getattr(inner, "compute_dtype", ms.float32)
        self.low_precision = self.compute_dtype != ms.float32

    def masked_core(self, q, k, v, mask):
        """q (b, n, S_u, d) of this rank's Ulysses group's chunks, k/v likewise: k and v gathered over the ring
        (storage order), this rank's rows of the whole-sequence mask, plain softmax attention."""
        if self.ring > 1:
            k = ops.transpose(self.gather_k(ops.transpose(k, (2, 0, 1, 3))), (1, 2, 0, 3))
            v = ops.transpose(self.gather_v(ops.transpose(v, (2, 0, 1, 3))), (1, 2, 0, 3))
            rows = q.shape[2]
            mask = mask.reshape(mask.shape[0], 1, self.ring, rows, mask.shape[-1])
            mask = (mask * self.ring_rows.reshape(1, 1, self.ring, 1, 1)).sum(2)
        if self.kv_repeat > 1:
            k = ops.repeat_interleave(k, self.kv_repeat, 1)
            v = ops.repeat_interleave(v, self.kv_repeat, 1)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale + mask
        return ops.matmul(ops.softmax(scores, axis=-1), v)

    def construct(self, q, k, v, mask=None):
        b, s = q.shape[0], q.shape[2]
        dv = v.shape[-1]
        if self.low_precision:
            q, k, v = ops.cast(q, ms.float32), ops.cast(k, ms.float32), ops.cast(v, ms.float32)
        # the ring packs k and v along the head dim: head dims that differ (multi-latent attention) are padded
        # with zeros to one width (zeros add nothing to q.k and give zero output columns, cut off below)
        q, k, v = _pad_last(q, self.head_dim), _pad_last(k, self.head_dim), _pad_last(v, self.head_dim)
        if self.pre_repeat > 1:
            k = ops.repeat_interleave(k, self.pre_repeat, 1)
            v = ops.repeat_interleave(v, self.pre_repeat, 1)
        if self.u > 1:
            q, k, v = self.a2a_q(q, self.slots), self.a2a_k(k, self.slots), self.a2a_v(v, self.slots)
        if self.masked:
            o = self.masked_core(q, k, v, ops.cast(mask, ms.float32))[..., :dv]
        else:
            o = self.core(q, k, v)[..., :dv]
        if self.u > 1:
            o = self.a2a_out(o, self.slots)
        if self.low_precision:
            o = ops.cast(o, self.compute_dtype)
        return ops.transpose(o, (0, 2, 1, 3)).reshape(b, s, -1)


def _pad_last(x, width: int):
    """x with zero columns appended to its last dim up to ``width`` (x itself when it has that width)."""
    extra = width - x.shape[-1]
    if extra <= 0:
        return x
    return ops.concat((x, ops.zeros(x.shape[:-1] + (extra,), x.dtype)), -1)


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
