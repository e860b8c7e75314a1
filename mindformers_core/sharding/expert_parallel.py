"""Expert parallelism: the experts of a MoE layer split over the ``ep`` mesh axis.

Mesh. Expert-parallel groups are carved out of data parallel (as in MindFormers, ``ep`` divides
``dp``): data-parallel index ``d = edp_index * ep + ep_index``, so the mesh is
``("edp", "ep", "cp", "tp")`` and the name ``"dp"`` stays an axis group for ``("edp", "ep")``.
Every layout written with ``"dp"`` (the batch split, the model's ``shard()`` declarations) means
the same ranks and slices as without experts; dense weights' gradients are summed over
``("edp", "ep")`` (all of data parallel), expert weights' (split over ``ep``) over ``edp`` only:
the expert-data-parallel group.

Kernel. :class:`ExpertParallelExperts` replaces a ``moe_experts`` Cell when its weights are split
over ``ep`` (``sharding/rules/moe.py``). Each rank routes its own tokens exactly as one card would
(``expert_dispatch``: the padded (E, C, h) buffer, C from the rank's own token count), then:

1. all-to-all over the ep group: the buffer's block of experts ``[p * E/P, (p + 1) * E/P)`` goes to
   rank ``p``; each rank receives (P sources, E/P local experts, C, h);
2. one batched SwiGLU per local expert over the P * C rows from all sources;
3. the inverse all-to-all brings every row back to its token's rank, which combines as one card.

The buffer shape depends only on (tokens, k, E, C), so every rank compiles the same graph and the
all-to-all has equal chunks; the per-expert counts are implicit in the zero rows of empty slots.
Dropless (C = the rank's token count) pads each (source, expert) block to its worst case;
``moe_expert_capacity_factor`` bounds C and drops what does not fit (on each source, in token
order) -- the same decision one card takes for the same tokens. Backward: the all-to-all over dim 0
is its own inverse (the Ulysses exchange of ``context_parallel``); the rest is ordinary autodiff.
Bytes per rank and step on the wire: 2 (forward) + 2 (backward) all-to-alls of (P - 1) / P * E * C *
h elements (the CPU emulation all-gathers: P times that, see ``distributed/comm/kernels.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import nn

from ..distributed.comm import kernels as K
from ..distributed.comm.kernels import CommCell
from .context_parallel import _UlyssesExchange
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
        self.exchange = _UlyssesExchange(group, 0, 0)
        self.compute_dtype = getattr(inner, "compute_dtype", None)

    def construct(self, x, weights, index):
        h, k = x.shape[-1], index.shape[-1]
        tokens = x.reshape(-1, h)
        if self.compute_dtype is not None:
            tokens = tokens.astype(self.compute_dtype)
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
