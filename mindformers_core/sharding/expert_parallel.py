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

Variable counts (dropless routing in PyNative; the default there). The routed (token, k) rows are
grouped by expert (token order within an expert); the per-expert counts of every rank are exchanged
first (one all-gather of the ``P x E`` count matrix, whose block sums are the ``P x P`` send
matrix), then :class:`~mindformers_core.distributed.comm.exchange.AllToAllV` moves exactly the routed
rows; each local expert runs one SwiGLU on exactly its rows (from all sources, no padding), the
inverse exchange (the transposed matrix) brings them home, and they are combined as one card does.
Rows on the wire per rank and step: the off-rank routed rows, 2 forward + 2 backward exchanges.

Padded equal chunks (under ``ms.jit``, and with ``moe_expert_capacity_factor``). MindSpore's graph
needs static shapes, and on CPU the count-dependent buffer sizes of the variable path can only be
read on the host, so a traced step keeps the layout of ``expert_dispatch``: the padded (E, C, h)
buffer, C from the rank's own token count, then

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
would get wrong.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.graph.api import _run_in_jit

from ..distributed.comm import kernels as K
from ..distributed.comm.exchange import AllToAllExchange, AllToAllV, gather_counts
from ..distributed.comm.kernels import CommCell
from .expert_dispatch import capacity, combine, dispatch, dispatch_indices, swiglu_experts
from .layout import Layout
from .propagation import Declaration, PlanError
from .styles import ParallelStyle


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

    def __init__(self, inner: nn.Cell, group, num_experts: int, local_tokens: int, topk: int, capacity_factor=None):
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
        self.last_counts = None          # the (P, E) count matrix of the last variable-path call (tests, bench)

    def construct(self, x, weights, index):
        if _run_in_jit():  # @jit.cond: True
            return self.padded(x, weights, index)
        if self.variable:
            return self.routed_rows(x, weights, index)
        return self.padded(x, weights, index)

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
        inner = self.inner
        dtype = tokens.dtype
        outs = ()
        for local, (start, stop) in enumerate(plan["expert_rows"]):
            if stop > start:
                outs = outs + (swiglu_rows(rows[start:stop], inner.w_gate[local].astype(dtype),
                                           inner.w_up[local].astype(dtype), inner.w_down[local].astype(dtype)),)
        out = ops.concat(outs, 0) if len(outs) > 1 else (outs[0] if outs else rows)
        out = ops.gather(out, Tensor(plan["by_source"]), 0) if out.shape[0] else out
        back = self.exchange_v(out, Tensor(np.ascontiguousarray(plan["matrix"].T)))   # my rows, by expert
        mine = ops.gather(back, Tensor(plan["unsort"]), 0).reshape(n, k, h)           # token-major
        y = (mine * ops.expand_dims(weights.reshape(n, k).astype(mine.dtype), -1)).sum(1)
        return y.reshape(x.shape).astype(x.dtype)

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
        inner = self.inner
        dtype = tokens.dtype
        out = swiglu_experts(rows, inner.w_gate.astype(dtype), inner.w_up.astype(dtype), inner.w_down.astype(dtype))
        out = out.reshape(L, P, C, h).transpose(1, 0, 2, 3).reshape(P, L * C, h)
        back = self.exchange(out, self.slots).reshape(self.E * C, h)                      # my rows, all experts
        y = combine(back, slot, weights.reshape(n, k))
        return y.reshape(x.shape).astype(x.dtype)


def swiglu_rows(x, w_gate, w_up, w_down):
    """``(silu(x W_gate) * (x W_up)) W_down`` for one expert on its (rows, h) input."""
    return ops.matmul(ops.silu(ops.matmul(x, w_gate)) * ops.matmul(x, w_up), w_down)


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


@dataclass(repr=False)
class ExpertParallel(ParallelStyle):
    """Plan style for a ``moe_experts`` Cell (``RoutedExperts``): the expert dim (0) of its weights
    split over ``axis``; tokens are routed to the ranks holding their experts by all-to-all."""
    axis: str = "ep"

    def declare(self, cell, path, mesh):
        if getattr(type(cell), "sharding_op", None) != "moe_experts":
            raise PlanError(f"{path}: ExpertParallel() applies to a routed-experts Cell (sharding_op "
                            f"'moe_experts'), not {type(cell).__name__}")
        if self.axis not in mesh.alias_name:
            raise PlanError(f"{path}: mesh axis {self.axis!r} is not in the mesh {mesh.alias_name}; plan on "
                            f"expert_mesh(dp, cp, tp, ep) or a config with expert_model_parallel_size > 1")
        return Declaration(path, weights={n: mesh(self.axis, "None", "None")
                                          for n in getattr(cell, "sharding_params", ())})
