"""All-to-all exchanges as differentiable Cells: equal chunks (any mode) and variable counts (PyNative).

:class:`SlotAllToAll` / :class:`AllToAllExchange`: the equal-chunk all-to-all whose rank flags are an
*argument* (this rank's one-hot slot vector, a non-trainable Parameter held by the caller), so that its
``bprop`` reads no Parameter and stays differentiable inside a graph taken from PyNative (hsdp level3
islands, jit pipeline stages). Context parallelism's Ulysses exchange and the padded expert-parallel
path use it.

:class:`AllToAllV` / :func:`all_to_all_v`: the variable-count all-to-all. Every rank knows how many
rows it sends to each peer; the counts are exchanged first (one small collective: the ``P x P``
count matrix, :func:`gather_counts`), then the rows move with exactly those counts. The backward is
the same exchange with the transposed matrix. The counts decide shapes, so this runs in PyNative
only (the host reads the matrix); under ``ms.jit`` use the equal-chunk exchange on a padded buffer.

Native: ``ops.AlltoAllV`` where capabilities.py says the device has it (Ascend). CPU emulation (on
what MCCL has): every rank contributes its concatenated send rows padded to the largest send total
``M`` in the group, all-gathered (native world AllGather, or the AllReduce-SUM slot emulation on a
subgroup), and keeps its own pieces: ``P * M`` rows per rank and exchange, against ``P * E * C`` for
the padded equal-chunk layout of the experts (see docs/moe.md).
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from ..process_group import ProcessGroup
from . import kernels as K
from .capabilities import is_native
from .kernels import CommCell


# ---- equal chunks, flags as arguments ------------------------------------------------------------------
class SlotAllToAll(CommCell):
    """All-to-all inside ``group``, ``construct(x, slots)`` with this rank's one-hot slot vector as an
    argument: split ``x`` into ``n`` chunks along ``split_dim``, chunk ``j`` to member ``j``, received
    chunks concatenated along ``concat_dim``. Native where the device has it; on CPU an all-gather
    through AllReduce-SUM (slot ``j`` filled by member ``j``), then own chunks."""

    def __init__(self, group: ProcessGroup, split_dim: int, concat_dim: int):
        super().__init__()
        self.n, self.index = group.size, group.local_rank
        self.split_dim, self.concat_dim = split_dim, concat_dim
        self.native = K.is_native("all_to_all", group)
        if self.native:
            self.prim = ops.AlltoAll(split_count=self.n, split_dim=split_dim, concat_dim=concat_dim,
                                     group=group.name)
        else:
            self.reduce = K._SumAllReduce(group)

    def construct(self, x, slots):
        if self.native:
            return self.prim(x)
        n = self.n
        size = x.shape[self.split_dim] // n
        flags = (slots > 0.5).reshape((n,) + (1,) * x.ndim)
        stacked = ops.broadcast_to(ops.expand_dims(x, 0), (n,) + x.shape)
        everyone = self.reduce(ops.select(flags, stacked, ops.zeros_like(stacked)))
        parts = ()
        for j in range(n):
            parts = parts + (ops.narrow(everyone[j], self.split_dim, self.index * size, size),)
        return ops.concat(parts, self.concat_dim)


class AllToAllExchange(CommCell):
    """Differentiable :class:`SlotAllToAll`, ``construct(x, slots)``: the backward is the inverse
    all-to-all (split and concat dims swapped), built from :func:`backward_twin`; the bprop reads the
    slot vector from its arguments, no Parameter."""

    def __init__(self, group: ProcessGroup, split_dim: int, concat_dim: int):
        super().__init__()
        self.forward_kernel = SlotAllToAll(group, split_dim, concat_dim)
        self.backward_kernel = backward_twin().SlotAllToAll(group, concat_dim, split_dim)

    def construct(self, x, slots):
        return self.forward_kernel(x, slots)

    def bprop(self, x, slots, out, dout):
        return self.backward_kernel(dout, slots), ops.zeros_like(slots)


def backward_twin():
    """A second, private instance of this module, whose Cells build the backward.

    MindSpore 2.10, differentiating from PyNative a graph (``ms.jit``: an hsdp level3 island, a jit
    pipeline stage) that holds a Cell ``bprop``, fails when the bprop and the forward call the same
    Python function ("The pointer[func_graph->get_return()] is null", manager.cc MaybeDropFuncGraphs:
    the shared function's graph is dropped with one of them). The twin's functions are other objects
    with the same code, so nothing is shared."""
    if __name__.endswith("_backward_twin"):
        return sys.modules[__name__]
    return module_twin(__name__, __file__)


def module_twin(module_name: str, path: str):
    """``<module_name>_backward_twin``: the module at ``path`` executed once more under that name (cached in
    ``sys.modules``); see :func:`backward_twin` for why a Cell bprop needs one. Shared by every module whose
    custom backwards need their own function objects (also ``sharding/context_parallel.py``)."""
    name = module_name + "_backward_twin"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


# ---- variable counts --------------------------------------------------------------------------------------
def check_count_matrix(matrix, size: int) -> np.ndarray:
    """``matrix`` as a ``(size, size)`` int64 array of non-negative counts, or a ValueError saying why not."""
    m = np.asarray(matrix)
    if m.shape != (size, size):
        raise ValueError(f"all_to_all_v: count matrix shape {m.shape}; expected ({size}, {size}) for a group "
                         f"of {size} ranks (row i: what rank i sends to each rank)")
    if m.size and (m.min() < 0 or not np.all(np.equal(np.floor(m), m))):
        raise ValueError(f"all_to_all_v: counts must be non-negative integers, got {m.tolist()}")
    return m.astype(np.int64)


def receive_index(matrix, me: int, padded: int) -> np.ndarray:
    """Rows of the all-gathered ``(P * padded)`` send buffers that member ``me`` keeps, in source order:
    source ``j`` sent its rows grouped by destination, so ``me``'s piece starts at ``sum(matrix[j, :me])``."""
    m = np.asarray(matrix, np.int64)
    starts = np.cumsum(m, 1) - m                       # starts[j, d]: offset of j's piece for d
    return np.concatenate([j * padded + starts[j, me] + np.arange(m[j, me]) for j in range(m.shape[0])]
                          ).astype(np.int32)


def emulated_all_to_all_v(sends, matrix):
    """NumPy reference of the exchange (tests): ``sends[i]`` holds rank i's rows grouped by destination;
    returns what each rank receives (source order), computed the way the CPU emulation does."""
    m = np.asarray(matrix, np.int64)
    padded = max(int(m.sum(1).max()), 1)
    rows = np.zeros((len(sends), padded) + np.asarray(sends[0]).shape[1:], np.asarray(sends[0]).dtype)
    for i, s in enumerate(sends):
        rows[i, :len(s)] = s
    flat = rows.reshape((-1,) + rows.shape[2:])
    return [flat[receive_index(m, me, padded)] for me in range(len(sends))]


def all_to_all_v_bytes(matrix, row_bytes: int, me: int) -> dict:
    """Bytes of one exchange for member ``me``: ``"sent"`` the off-rank rows it sends (what a native
    AlltoAllV puts on the wire), ``"emulated"`` the all-gather buffer of the CPU emulation
    (``P * M`` rows, ``M`` the largest send total) and ``"counts"`` the count exchange."""
    m = np.asarray(matrix, np.int64)
    p = m.shape[0]
    padded = max(int(m.sum(1).max()), 1)
    return {"sent": int(m[me].sum() - m[me, me]) * row_bytes, "emulated": p * padded * row_bytes,
            "counts": p * p * 4}


class AllToAllV(CommCell):
    """Variable-count all-to-all along dim 0, ``construct(x, matrix)``: ``matrix`` (P, P) int Tensor,
    ``matrix[i, j]`` = rows member ``i`` sends to member ``j``; ``x`` holds this member's
    ``sum(matrix[me])`` rows grouped by destination. Returns the ``sum(matrix[:, me])`` rows received,
    grouped by source. Backward: the same exchange with ``matrix.T``. PyNative only (the host reads the
    counts to size the buffers); every member of the group must call it with the same matrix."""

    def __init__(self, group: ProcessGroup):
        super().__init__()
        self.n, self.index = group.size, group.local_rank
        self.native = is_native("all_to_all_v", group)
        if self.native:
            self.prim = ops.AlltoAllV(group=group.name)
        elif self.n > 1:
            self.gather = K.AllGatherKernel(group, 0)

    def construct(self, x, matrix):
        return self.exchange(x, matrix.asnumpy())

    def bprop(self, x, matrix, out, dout):
        return self.exchange(dout, matrix.asnumpy().T), ops.zeros_like(matrix)

    def exchange(self, x, m):
        me, n = self.index, self.n
        m = check_count_matrix(m, n)
        rest = tuple(x.shape[1:])
        if int(m[me].sum()) != x.shape[0]:
            raise ValueError(f"all_to_all_v: member {me} holds {x.shape[0]} rows but the count matrix says it "
                             f"sends {int(m[me].sum())} ({m[me].tolist()})")
        if n == 1:
            return x
        if self.native:
            row = int(np.prod(rest)) if rest else 1
            got = self.prim(x.reshape(-1), [int(c) * row for c in m[me]], [int(c) * row for c in m[:, me]])
            return got.reshape((int(m[:, me].sum()),) + rest)
        padded = max(int(m.sum(1).max()), 1)
        if x.shape[0] < padded:
            x = ops.concat((x, ops.zeros((padded - x.shape[0],) + rest, x.dtype)), 0)
        everyone = self.gather(x)                                            # (P * padded, ...)
        return ops.gather(everyone, Tensor(receive_index(m, me, padded)), 0)


def gather_counts(group: ProcessGroup, counts) -> np.ndarray:
    """Every member's count vector (length K, the same K everywhere) as a ``(P, K)`` int64 array: one
    all-gather of ``P * K`` numbers (float32 on the wire, exact below 2**24)."""
    counts = np.asarray(counts, np.float32).reshape(1, -1)
    if group.size == 1:
        return counts.astype(np.int64)
    from .functional import cached_comm_cell
    kernel = cached_comm_cell(("gather_counts", group.ranks), lambda: K.AllGatherKernel(group, 0))
    return np.rint(kernel(Tensor(counts)).asnumpy()).astype(np.int64)


def all_to_all_v(x, send_counts, group=None):
    """Send ``send_counts[j]`` rows of ``x`` (dim 0, grouped by destination) to group member ``j``;
    returns the rows received from every member, in member order. The counts are exchanged first
    (:func:`gather_counts`); the backward is the exchange with the counts transposed. PyNative only."""
    from .functional import cached_comm_cell
    from ..process_group import resolve_group
    g = resolve_group(group)
    send = np.asarray(send_counts)
    if send.shape != (g.size,) or (send.size and (send.min() < 0 or not np.all(np.floor(send) == send))):
        raise ValueError(f"all_to_all_v: send_counts={send.tolist()}; expected {g.size} non-negative integers "
                         f"(one per member of the group)")
    if int(send.sum()) != x.shape[0]:
        raise ValueError(f"all_to_all_v: send_counts={send.tolist()} add up to {int(send.sum())} but x has "
                         f"{x.shape[0]} rows")
    matrix = gather_counts(g, send)
    cell = cached_comm_cell(("all_to_all_v", g.ranks), lambda: AllToAllV(g))
    return cell(x, Tensor(matrix.astype(np.int32)))
