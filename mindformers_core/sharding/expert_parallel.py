"""Expert parallelism: the experts of a MoE layer split over the ``ep`` mesh axis.

Mesh. Expert-parallel groups are carved out of data parallel (as in MindFormers, ``ep`` divides
``dp``): data-parallel index ``d = edp_index * ep + ep_index``, so the mesh is
``("edp", "ep", "cp", "tp")`` and the name ``"dp"`` stays an axis group for ``("edp", "ep")``.
Every layout written with ``"dp"`` (the batch split, the model's ``shard()`` declarations) means
the same ranks and slices as without experts; dense weights' gradients are summed over
``("edp", "ep")`` (all of data parallel), expert weights' (split over ``ep``) over ``edp`` only:
the expert-data-parallel group.

Kernel. :class:`ExpertParallelExperts` replaces a ``moe_experts`` Cell when its weights are split
over ``ep`` (``sharding/rules/moe.py``). Rank ``p`` holds experts ``[p * E/P, (p + 1) * E/P)``. Each
rank routes its own tokens exactly as one card would; the kernel has two paths.

Variable counts (dropless routing in PyNative; the default there: :meth:`routed_rows`). The routed (token, k) rows are
grouped by expert (token order within an expert); the per-expert counts of every rank are exchanged
first (one all-gather of the ``P x E`` count matrix, whose block sums are the ``P x P`` send
matrix), then :class:`~mindformers_core.distributed.comm.exchange.AllToAllV` moves exactly the routed
rows; each local expert runs one SwiGLU on exactly its rows (from all sources, no padding), the
inverse exchange (the transposed matrix) brings them home, and they are combined as one card does.
Rows on the wire per rank and step: the off-rank routed rows, 2 forward + 2 backward exchanges.

Graph mode (dropless routing under ``ms.jit``, the default there: :meth:`routed_graph`). The host
cannot read the counts inside a traced step, and MindSpore 2.10's CPU collectives need static shapes
(a native AllGather of lengths that differ between ranks fails: ``RingAllGather ... Memcpy error``), so
only this rank's own expert compute has data-dependent shapes:

1. the rank's ``R = N k`` rows sorted by expert (an exact integer permutation, :func:`sort_rows_by_expert`);
   the per-expert counts all-gathered first (the ``P x E`` matrix), then the ``R`` rows (a static
   ``(P R, h)`` buffer; the emulated all-gather, an AllReduce-SUM of a slot buffer);
2. from the count matrix every rank knows the expert of every gathered row
   (:func:`expert_of_sorted_rows`); each local expert picks its rows (``nonzero``: data-dependent length)
   plus one zero sentinel row, so no dynamic tensor is ever empty (MindSpore 2.10 rejects empty dynamic
   inputs to the MatMul backward: "inputs must not be empty tensor for dynamic shape case in JIT mode",
   and NonZero then fails to resize), and runs one SwiGLU on exactly them;
3. the outputs are written back to their places of the ``(P R, h)`` layout (each place by exactly one
   rank) and summed over the ranks (an AllReduce-SUM: a reduce-scatter), each rank keeps its ``R`` rows and
   combines them as one card. The backward is MindSpore's own AllReduce bprop: no Cell bprop, so the
   path is differentiable inside graphs taken from PyNative (hsdp level3 islands, jit pipeline stages).

Rows on the CPU wire per rank and exchange: ``P R`` (against ``P E N`` for padded dropless chunks: ``E/k``
times fewer); a native AlltoAllV would send only the off-rank rows, which the kernel records per call in
the graph (``routed_counts``, ``wire_rows``; :meth:`graph_counts`). ``jit_variable=False`` (constructor
argument or attribute, read when a graph is traced) keeps jit on the padded path.

Padded equal chunks (with ``moe_expert_capacity_factor``, and under ``ms.jit`` with ``jit_variable=False``):
a traced step keeps the layout of ``expert_dispatch``: the padded (E, C, h) buffer, C from the rank's own
token count, then

1. all-to-all over the ep group: the buffer's block of experts ``[p * E/P, (p + 1) * E/P)`` goes to
   rank ``p``; each rank receives (P sources, E/P local experts, C, h);
2. one batched SwiGLU per local expert over the P * C rows from all sources;
3. the inverse all-to-all brings every row back to its token's rank, which combines as one card.

The buffer shape depends only on (tokens, k, E, C), so every rank compiles the same graph and the
all-to-all has equal chunks; the per-expert counts are implicit in the zero rows of empty slots.
Dropless (C = the rank's token count) pads each (source, expert) block to its worst case;
``moe_expert_capacity_factor`` bounds C and drops what does not fit (on each source, in token
order) -- the same decision one card takes for the same tokens. Backward: the all-to-all over dim 0
is its own inverse (``AllToAllExchange``); the rest is ordinary autodiff.
Bytes per rank and step on the wire: 2 (forward) + 2 (backward) all-to-alls of (P - 1) / P * E * C *
h elements (the CPU emulation all-gathers: P times that, see ``distributed/comm/kernels.py``).

Which path: ``mindspore.graph.api._run_in_jit()`` -- MindSpore's own test (its ``recompute`` and
``grad`` use it with the same ``# @jit.cond: True`` hint): a constexpr that is True while ``ms.jit``
parses the Cell (a jit step, an hsdp level3 island, a jit pipeline stage) and False when PyNative
runs it, decided per call, not by a global mode flag that a jit step inside a PyNative program
would get wrong. Under jit, dropless routing takes :meth:`routed_graph` unless ``jit_variable`` is False.
"""
from __future__ import annotations

import itertools

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.graph.api import _run_in_jit

from ..distributed.comm import kernels as K
from ..distributed.comm.exchange import AllToAllExchange, AllToAllV, gather_counts
from ..distributed.comm.kernels import CommCell
from .expert_dispatch import capacity, combine, dispatch, dispatch_indices, swiglu_experts
from .layout import Layout

_COUNT_IDS = itertools.count()


def expert_mesh(dp: int, cp: int, tp: int, ep: int, rank_list=None) -> Layout:
    """The ``("edp", "ep", "cp", "tp")`` device matrix with ``"dp"`` = ``("edp", "ep")``."""
    if ep < 1 or dp % ep:
        raise ValueError(f"expert_model_parallel_size={ep} must divide data_parallel_size={dp} (the expert-parallel "
                         f"groups are carved out of data parallel)")
    return Layout((dp // ep, ep, cp, tp), ("edp", "ep", "cp", "tp"), rank_list, axis_groups={"dp": ("edp", "ep")})


def all_to_all_bytes(num_experts: int, cap: int, hidden: int, ep: int, itemsize: int = 4) -> int:
    """Analytic payload of one step (forward + backward: 4 all-to-alls) per rank, off-rank part."""
    return 4 * (ep - 1) * (num_experts // ep) * cap * hidden * itemsize


class ExpertParallelExperts(CommCell):
    """Drop-in for a ``moe_experts`` Cell whose expert weights hold this rank's ``E / P`` experts."""

    mfc_replaces_inner = True   # computes with inner's weights without calling inner

    def __init__(self, inner: nn.Cell, group, num_experts: int, local_tokens: int, topk: int, capacity_factor=None,
                 jit_variable: bool = True):
        super().__init__()
        self.inner = inner
        self.P = group.size
        self.E = num_experts
        self.L = num_experts // self.P
        self.topk = topk
        self.cap = capacity(local_tokens, topk, num_experts, capacity_factor)
        # the all-to-all takes this rank's one-hot slot vector as an argument (a non-trainable Parameter), so
        # its bprop reads no Parameter: differentiable inside a graph taken from PyNative (hsdp level3 islands),
        # as the Ulysses all-to-all of context parallelism (sharding/context_parallel.py)
        slots = np.zeros((self.P,), np.float32)
        slots[group.local_rank] = 1.0
        self.slots = K._flag_parameter(slots)
        self.exchange = AllToAllExchange(group, 0, 0)
        self.group = group
        self.index = group.local_rank
        # dropless routing takes the variable-count path in PyNative; capacity-factor routing stays padded
        self.variable = capacity_factor is None and self.P > 1
        if self.variable:
            self.exchange_v = AllToAllV(group)
        self.compute_dtype = getattr(inner, "compute_dtype", None)
        self.last_counts = None          # the (P, E) count matrix of the last PyNative variable-path call
        # under jit, dropless routing takes the graph-mode variable path (routed_graph) unless jit_variable is
        # False (then the padded path, as with a capacity factor); read when a graph is traced
        self.jit_variable = bool(jit_variable)
        if self.variable:
            # the graph path's collectives: the emulated all-gather (an AllReduce-SUM of a slot buffer) and the
            # AllReduce-SUM, both differentiated by MindSpore's own AllReduce bprop (no Cell bprop: see routed_graph)
            from ..distributed.comm.capabilities import force_emulation
            with force_emulation():
                self.gather_rows = K.AllGatherKernel(group, 0)
            self.sum_rows = K._SumAllReduce(group)
            # what the graph path records each call (read by tests and bench/moe.py through graph_counts()):
            # the (P, E) count matrix it exchanged, and [off-rank rows sent forward (dispatch + combine), rows
            # in the emulated buffers forward], summed over calls until reset_graph_counts()
            n = next(_COUNT_IDS)
            self.routed_counts = Parameter(Tensor(np.full((self.P, self.E), -1, np.float32)),
                                           name=f"mfc_expert_counts_{n}", requires_grad=False)
            self.wire_rows = Parameter(Tensor(np.zeros((2,), np.float32)), name=f"mfc_expert_wire_rows_{n}",
                                       requires_grad=False)

    @property
    def dynamic_shapes_under_jit(self) -> bool:
        """Under jit this Cell computes on data-dependent row sets (:meth:`routed_graph`): graphs holding it
        keep MindSpore's own launch (common/graphs.compile_blocking, which reads this)."""
        return self.variable and self.jit_variable

    def construct(self, x, weights, index):
        if _run_in_jit():  # @jit.cond: True
            if self.variable and self.jit_variable:
                return self.routed_graph(x, weights, index)
            return self.padded(x, weights, index)
        if self.variable:
            return self.routed_rows(x, weights, index)
        return self.padded(x, weights, index)

    def graph_counts(self):
        """What the graph path recorded: ``(counts, wire)`` with ``counts`` the (P, E) int count matrix of its
        last call (None if it never ran) and ``wire`` = {"sent_rows", "buffer_rows"} summed since the last reset."""
        if not self.variable:
            return None, {"sent_rows": 0, "buffer_rows": 0}
        c = self.routed_counts.asnumpy()
        w = self.wire_rows.asnumpy()
        counts = None if c.min() < 0 else np.rint(c).astype(np.int64)
        return counts, {"sent_rows": int(round(float(w[0]))), "buffer_rows": int(round(float(w[1])))}

    def reset_graph_counts(self):
        if self.variable:
            self.routed_counts.set_data(Tensor(np.full((self.P, self.E), -1, np.float32)))
            self.wire_rows.set_data(Tensor(np.zeros((2,), np.float32)))

    def flat_tokens(self, x):
        """(tokens, hidden) in the experts' compute dtype: what both paths route."""
        tokens = x.reshape(-1, x.shape[-1])
        if self.compute_dtype is not None:
            tokens = tokens.astype(self.compute_dtype)
        return tokens

    def routed_rows(self, x, weights, index):
        """The variable-count path (PyNative): exactly the routed rows travel."""
        h, k = x.shape[-1], index.shape[-1]
        tokens = self.flat_tokens(x)
        n = tokens.shape[0]
        expert = index.asnumpy().reshape(-1).astype(np.int64)
        counts = gather_counts(self.group, np.bincount(expert, minlength=self.E))      # (P, E)
        self.last_counts = counts
        plan = routed_plan(expert, k, counts, self.index, self.L)
        send = ops.gather(tokens, Tensor(plan["send_token"]), 0)                      # my rows, by expert
        got = self.exchange_v(send, Tensor(plan["matrix"]))                           # by source, by expert
        rows = ops.gather(got, Tensor(plan["by_expert"]), 0) if got.shape[0] else got  # by local expert
        w_gate, w_up, w_down = self.inner.expert_weights(tokens.dtype)
        outs = ()
        for local, (start, stop) in enumerate(plan["expert_rows"]):
            if stop > start:
                outs = outs + (swiglu_rows(rows[start:stop], w_gate[local], w_up[local], w_down[local]),)
        out = ops.concat(outs, 0) if len(outs) > 1 else (outs[0] if outs else rows)
        out = ops.gather(out, Tensor(plan["by_source"]), 0) if out.shape[0] else out
        back = self.exchange_v(out, Tensor(np.ascontiguousarray(plan["matrix"].T)))   # my rows, by expert
        mine = ops.gather(back, Tensor(plan["unsort"]), 0).reshape(n, k, h)           # token-major
        y = (mine * ops.expand_dims(weights.reshape(n, k).astype(mine.dtype), -1)).sum(1)
        return y.reshape(x.shape).astype(x.dtype)

    def routed_graph(self, x, weights, index):
        """The variable-count path under ``ms.jit``: exactly the routed rows are computed, and the wire carries
        ``P * N * k`` rows instead of the padded ``P * E * N``. Static shapes on the wire, data-dependent
        shapes only in this rank's own expert compute (see the module docstring, "Graph mode")."""
        h, k = x.shape[-1], index.shape[-1]
        tokens = self.flat_tokens(x)
        n = tokens.shape[0]
        P, L, E = self.P, self.L, self.E
        R = n * k
        expert = index.reshape(-1).astype(ms.int32)
        slot, order, counts = sort_rows_by_expert(expert, E)                  # exact integer permutation
        send = ops.gather(tokens, order // k, 0)                              # (R, h): my rows, by expert
        matrix = self.gather_rows(counts.astype(ms.float32).reshape(1, E))   # (P, E): counts first
        everyone = self.gather_rows(send)                                     # (P * R, h) static
        # the rank is data (its one-hot slot vector), never a Python constant: every rank traces one graph
        me = (self.slots * ops.arange(0, P, 1, dtype=ms.float32)).sum().astype(ms.int32)
        row_expert = expert_of_sorted_rows(ops.stop_gradient(matrix).astype(ms.int32), R)   # (P * R,)
        # one zero sentinel row (index P * R) joins every local expert's rows: no data-dependent tensor is
        # ever empty (MindSpore 2.10 jit rejects empty dynamic inputs to the MatMul backward; NonZero then
        # fails to resize); its output is zero (SwiGLU(0) = 0) and its gradient zero
        everyone = ops.concat((everyone, ops.zeros((1, h), everyone.dtype)), 0)
        sentinel = ops.fill(ms.int32, (1,), P * R)
        w_gate, w_up, w_down = self.inner.expert_weights(tokens.dtype)
        outs, places = (), ()
        for local in range(L):
            where = ops.nonzero(row_expert == me * L + local).reshape(-1).astype(ms.int32)   # data-dependent
            where = ops.concat((where, sentinel), 0)
            rows = ops.gather(everyone, where, 0)
            outs = outs + (swiglu_rows(rows, w_gate[local], w_up[local], w_down[local]),)
            places = places + (where,)
        out = ops.concat(outs, 0) if L > 1 else outs[0]
        place = ops.concat(places, 0) if L > 1 else places[0]
        # every row goes back to its place in the all-gathered layout: (source, its expert-sorted row); each
        # place is written by exactly one rank (its expert's), so the sum over ranks is a reduce-scatter
        wire = ms.float32 if out.dtype == ms.bfloat16 else out.dtype   # CPU TensorScatterUpdate has no bfloat16
        buf = ops.tensor_scatter_update(ops.zeros((P * R + 1, h), wire), place.reshape(-1, 1), out.astype(wire))
        back = self.sum_rows(ops.narrow(buf, 0, 0, P * R)).astype(out.dtype)   # (P * R, h)
        mine = ops.gather(back, ops.arange(0, R, 1, dtype=ms.int32) + me * R, 0)   # my rows, by expert
        y = ops.gather(mine, slot, 0).reshape(n, k, h)                          # token-major
        y = (y * ops.expand_dims(weights.reshape(n, k).astype(y.dtype), -1)).sum(1)
        y = ops.depend(y, self.record(matrix, L, R))
        return y.reshape(x.shape).astype(x.dtype)

    def record(self, matrix, L, R):
        """Store the count matrix and add the forward's wire rows (tests, bench): off-rank rows this rank sent
        in the dispatch (its rows for other ranks' experts) and in the combine (rows of other ranks computed
        here), and the emulated buffers' rows (2 exchanges of P * R rows)."""
        m = ops.stop_gradient(matrix)
        P = self.P
        per_dest = m.reshape(P, P, L).sum(2)                                   # (source, destination)
        mine = self.slots.reshape(P, 1)
        sent = (per_dest * mine).sum() - (per_dest * mine * mine.reshape(1, P)).sum()
        received = (per_dest * mine.reshape(1, P)).sum() - (per_dest * mine * mine.reshape(1, P)).sum()
        wire = ops.stack((sent + received, ops.fill(ms.float32, (), 2 * P * R)))
        return ops.depend(ops.assign(self.routed_counts, m), ops.assign_add(self.wire_rows, wire))

    def padded(self, x, weights, index):
        """The equal-chunk path: static shapes (jit; capacity factor)."""
        h, k = x.shape[-1], index.shape[-1]
        tokens = self.flat_tokens(x)
        n = tokens.shape[0]
        P, L, C = self.P, self.L, self.cap
        slot, source = dispatch_indices(index.reshape(-1), self.E, C, k)
        buffer = dispatch(tokens, source).reshape(P, L * C, h)
        got = self.exchange(buffer, self.slots)                                           # (source, L * C, h)
        rows = got.reshape(P, L, C, h).transpose(1, 0, 2, 3).reshape(L, P * C, h)
        out = swiglu_experts(rows, *self.inner.expert_weights(tokens.dtype))
        out = out.reshape(L, P, C, h).transpose(1, 0, 2, 3).reshape(P, L * C, h)
        back = self.exchange(out, self.slots).reshape(self.E * C, h)                      # my rows, all experts
        y = combine(back, slot, weights.reshape(n, k))
        return y.reshape(x.shape).astype(x.dtype)


def swiglu_rows(x, w_gate, w_up, w_down):
    """``(silu(x W_gate) * (x W_up)) W_down`` for one expert on its (rows, h) input."""
    return ops.matmul(ops.silu(ops.matmul(x, w_gate)) * ops.matmul(x, w_up), w_down)


def sort_rows_by_expert(expert, num_experts: int):
    """Rows (token-major, ``expert`` (R,) int32 ids) grouped by expert, token order within an expert, as an
    exact integer permutation (no float sort keys): ``slot`` (R,) the place of each row in that order,
    ``order`` (R,) its inverse (the row at each place) and ``counts`` (E,) the rows per expert."""
    rows = expert.shape[0]
    onehot = ops.one_hot(expert, num_experts, ops.ones((), ms.int32), ops.zeros((), ms.int32))   # (R, E)
    counts = onehot.sum(0)
    position = (ops.cumsum(onehot, 0) * onehot).sum(1) - 1                  # rank within its expert
    start = ops.cumsum(counts, 0) - counts
    slot = ops.gather(start, expert, 0) + position
    order = ops.tensor_scatter_update(ops.zeros((rows,), ms.int32), slot.reshape(-1, 1),
                                      ops.arange(0, rows, 1, dtype=ms.int32))
    return slot.astype(ms.int32), order, counts


def expert_of_sorted_rows(matrix, rows: int):
    """The expert of every row of the all-gathered send buffers: ``matrix`` (P, E) int32 counts, source ``s``'s
    ``rows`` places hold its rows sorted by expert, padded with places past its count (expert ``E``: nobody's).
    Returns (P * rows,) int32."""
    ends = ops.cumsum(matrix, 1)                                            # (P, E) end of each expert's rows
    place = ops.broadcast_to(ops.arange(0, rows, 1, dtype=ms.int32).reshape(1, rows), (matrix.shape[0], rows))
    return ops.searchsorted(ends, place, right=True).astype(ms.int32).reshape(-1)   # experts ending at or before


def routed_plan(expert_of_row, topk: int, counts, me: int, local_experts: int) -> dict:
    """Host-side permutations of the variable-count path, from this rank's rows' experts and the
    ``(P, E)`` count matrix of all ranks (``counts[i, e]``: rows of rank ``i`` routed to expert ``e``):

    * ``send_token`` (R,): the token of each row sent, rows sorted by expert (token order within);
    * ``matrix`` (P, P) int32: rows rank ``i`` sends to rank ``j`` (the experts of ``j`` summed);
    * ``by_expert``: received rows (source-major, then expert) -> local-expert-major order;
      ``expert_rows``: each local expert's ``[start, stop)`` in that order; ``by_source``: its inverse;
    * ``unsort`` (R,): for each of this rank's rows in token-major order, its place among the sent rows.
    """
    expert = np.asarray(expert_of_row, np.int64)
    counts = np.asarray(counts, np.int64)
    P = counts.shape[0]
    L = local_experts
    if counts.shape[1] != P * L:
        raise ValueError(f"routed_plan: count matrix {counts.shape} does not hold {P} ranks x {L} experts")
    if not np.array_equal(counts[me], np.bincount(expert, minlength=P * L)):
        raise ValueError(f"routed_plan: row {me} of the count matrix {counts[me].tolist()} is not this rank's "
                         f"per-expert count")
    order = np.argsort(expert, kind="stable")
    unsort = np.empty_like(order)
    unsort[order] = np.arange(order.size)
    matrix = counts.reshape(P, P, L).sum(2)
    mine = counts[:, me * L:(me + 1) * L]                  # (sources, local experts) rows received
    recv_start = np.cumsum(mine.reshape(-1)) - mine.reshape(-1)   # source-major, expert-minor offsets
    recv_start = recv_start.reshape(P, L)
    by_expert, expert_rows, start = [], [], 0
    for local in range(L):
        for source in range(P):
            by_expert.append(recv_start[source, local] + np.arange(mine[source, local]))
        stop = start + int(mine[:, local].sum())
        expert_rows.append((start, stop))
        start = stop
    by_expert = np.concatenate(by_expert).astype(np.int64) if by_expert else np.zeros(0, np.int64)
    by_source = np.empty_like(by_expert)
    by_source[by_expert] = np.arange(by_expert.size)
    return {"send_token": (order // topk).astype(np.int32), "matrix": matrix.astype(np.int32),
            "by_expert": by_expert.astype(np.int32), "expert_rows": expert_rows,
            "by_source": by_source.astype(np.int32), "unsort": unsort.astype(np.int32)}
