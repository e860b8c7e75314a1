"""Forward-only collective kernels (Cells), native where the device has them, else emulated.

Each kernel fixes its group and attributes at construction, so inside ``ms.jit`` every branch
below is decided at compile time. Emulations (CPU) use only AllReduce-SUM:

====================  ==================================================  ========================
collective            emulation                                           bytes all-reduced / rank
====================  ==================================================  ========================
all_gather(dim)       zero buffer of the output, own slot filled          n * |x|
reduce_scatter(dim)   all-reduce of the input, keep own slice             |x|
all_reduce max/min    all_gather of the inputs, reduce locally            n * |x|
all_to_all            all_gather of the inputs, pick own chunks           n * |x|
broadcast(src)        src contributes x, others zeros                     |x|
send/recv             all-reduce in the two-rank group, receiver zeros    |x|
====================  ==================================================  ========================

Exception: with two ranks in all, send/recv are a native world broadcast from the sender (no
summation; measured cheaper by bench/pipeline_p2p.py).

SPMD rule: every rank must build the *same* graph, or MindSpore may order independent
collectives differently per rank (and prune ones a rank does not use), and ranks fall out of
step. So which rank does what is data — a one-hot ``Parameter`` flag read through
``ops.select`` — never a Python branch on the rank. Only send/recv differ by role.

The AllReduce kernel on CPU takes float32/float16; other dtypes are cast to float32 for the
reduction and back (integers are exact below 2**24 in magnitude).
"""
from __future__ import annotations

import itertools

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ..process_group import ProcessGroup, new_group
from .capabilities import is_native

class CommCell(nn.Cell):
    """Base of the communication Cells: parameter names stay as given (flags are uniquely
    named; path prefixes would collide between cached Cells)."""

    def __init__(self):
        super().__init__(auto_prefix=False)


class FreshCopy(CommCell):
    """``x`` as a new value (``ops.Identity``: one copy), for the forward of a Cell with a custom ``bprop`` that
    would otherwise return its input unchanged. MindSpore 2.10 graph mode (measured on CPU, one process, no
    collective): such a Cell (identity forward, e.g. a gradient-only all-reduce or a "make partial" step) gets
    wrong gradients upstream of it as soon as the graph holds any side effect (an ``assign_add`` counter
    anywhere, like the MoE router's), while PyNative is right; a forward producing a new value is right in both
    (``tests/test_comm_identity_bprop.py``)."""

    def __init__(self):
        super().__init__()
        self.copy = ops.Identity()

    def construct(self, x):
        return self.copy(x)


def passes_input_through(cell) -> bool:
    """Whether ``cell``'s forward returns its input unchanged (a kernel in its one-member ``identity`` mode)."""
    return getattr(cell, "mode", None) == "identity"


_MS_REDUCE = {"sum": "sum", "max": "max", "min": "min", "prod": "prod"}


class _SumAllReduce(CommCell):
    """AllReduce-SUM on a group, casting dtypes the CPU kernel lacks through float32."""

    def __init__(self, group: ProcessGroup):
        super().__init__()
        self.prim = ops.AllReduce(op="sum", group=group.name)
        self.cast_needed = ms.get_context("device_target") == "CPU"

    def construct(self, x):
        if self.cast_needed and x.dtype != ms.float32 and x.dtype != ms.float16:
            return self.prim(x.astype(ms.float32)).astype(x.dtype)
        return self.prim(x)


_FLAG_IDS = itertools.count()


def _flag_parameter(values: np.ndarray) -> Parameter:
    # a non-trainable Parameter is data to the compiler: never constant-folded or pruned
    return Parameter(Tensor(values), name=f"mfc_rank_flags_{next(_FLAG_IDS)}", requires_grad=False)


def rank_flags(size: int, index: int) -> Parameter:
    """One-hot bool flags of shape ``(size,)``, True at ``index``."""
    flags = np.zeros((size,), np.bool_)
    flags[index] = True
    return _flag_parameter(flags)


def role_flag(value: bool) -> Parameter:
    """A shape-``(1,)`` bool flag saying whether this rank plays a role (root, destination...)."""
    return _flag_parameter(np.array([bool(value)]))


class KeepAlive(CommCell):
    """``value`` unchanged, but data-dependent on ``dep`` so graph mode cannot prune ``dep``.

    Ranks must issue the same collectives in the same order. When a rank does not need a
    collective's result (a non-root of broadcast's backward, a sender's token), ``ops.depend``
    is not enough: MindSpore's optimizer drops the unused pure AllReduce on that rank only and
    the ranks fall out of step. Selecting through a non-constant False flag keeps the edge
    without changing ``value`` (and without NaN from ``0 * inf``).
    """

    def __init__(self):
        super().__init__()
        self.flag = role_flag(False)

    def construct(self, value, dep):
        first = dep.reshape(-1)[0:1].astype(value.dtype)
        picked = ops.select(self.flag, first, ops.zeros((1,), value.dtype))
        return value + picked.sum()


class AllReduceKernel(CommCell):
    """Reduce ``x`` over the group with sum, avg, max or min; every rank gets the result."""

    def __init__(self, group: ProcessGroup, op: str = "sum"):
        super().__init__()
        if op not in ("sum", "avg", "max", "min"):
            raise ValueError(f"all_reduce: op={op!r}; valid ops are 'sum', 'avg', 'max', 'min'")
        self.op = op
        self.n = group.size
        if self.n == 1:
            self.mode = "identity"
        elif op in ("sum", "avg"):
            self.mode = "sum"
            self.reduce = _SumAllReduce(group)
        elif is_native("all_reduce_" + op, group):
            self.mode = "native"
            self.reduce = ops.AllReduce(op=_MS_REDUCE[op], group=group.name)
        else:
            self.mode = "gather"
            self.gather = AllGatherKernel(group, 0)

    def construct(self, x):
        if self.mode == "identity":
            return x
        if self.mode == "sum":
            y = self.reduce(x)
            if self.op == "avg":
                y = y / self.n
            return y
        if self.mode == "native":
            return self.reduce(x)
        stacked = self.gather(ops.expand_dims(x, 0))
        if self.op == "max":
            return stacked.max(axis=0)
        return stacked.min(axis=0)


class AllGatherKernel(CommCell):
    """Concatenate every rank's ``x`` along ``dim`` in group order."""

    def __init__(self, group: ProcessGroup, dim: int = 0):
        super().__init__()
        self.n, self.index, self.dim = group.size, group.local_rank, dim
        if self.n == 1:
            self.mode = "identity"
        elif is_native("all_gather", group):
            self.mode = "native"
            self.prim = ops.AllGather(group=group.name)
        else:
            self.mode = "emulated"
            self.reduce = _SumAllReduce(group)
            self.flags = rank_flags(self.n, self.index)

    def construct(self, x):
        if self.mode == "identity":
            return x
        dim = self.dim if self.dim >= 0 else self.dim + x.ndim
        if self.mode == "native":
            y = self.prim(x)
            if dim == 0:
                return y
            return ops.concat(ops.split(y, x.shape[0], 0), dim)
        # slot j of an (n, *x.shape) buffer holds x on rank j, zeros elsewhere; sum fills all slots
        flags = self.flags.reshape((self.n,) + (1,) * x.ndim)
        stacked = ops.broadcast_to(ops.expand_dims(x, 0), (self.n,) + x.shape)
        slots = self.reduce(ops.select(flags, stacked, ops.zeros_like(stacked)))
        if dim == 0:
            return slots.reshape((self.n * x.shape[0],) + x.shape[1:])
        parts = ()
        for j in range(self.n):
            parts = parts + (slots[j],)
        return ops.concat(parts, dim)


class ReduceScatterKernel(CommCell):
    """Sum ``x`` over the group and keep this rank's ``1/n`` slice along ``dim``."""

    def __init__(self, group: ProcessGroup, dim: int = 0):
        super().__init__()
        self.n, self.index, self.dim = group.size, group.local_rank, dim
        if self.n == 1:
            self.mode = "identity"
        elif is_native("reduce_scatter", group):
            self.mode = "native"
            self.prim = ops.ReduceScatter(op="sum", group=group.name)
        else:
            self.mode = "emulated"
            self.reduce = _SumAllReduce(group)

    def construct(self, x):
        if self.mode == "identity":
            return x
        dim = self.dim if self.dim >= 0 else self.dim + x.ndim
        size = x.shape[dim] // self.n
        if self.mode == "native":
            if dim == 0:
                return self.prim(x)
            return self.prim(ops.concat(ops.split(x, size, dim), 0))
        return ops.narrow(self.reduce(x), dim, self.index * size, size)


class SplitKernel(CommCell):
    """This rank's ``1/n`` slice of ``x`` along ``dim`` (no communication)."""

    def __init__(self, group: ProcessGroup, dim: int = -1):
        super().__init__()
        self.n, self.index, self.dim = group.size, group.local_rank, dim

    def construct(self, x):
        if self.n == 1:
            return x
        dim = self.dim if self.dim >= 0 else self.dim + x.ndim
        size = x.shape[dim] // self.n
        return ops.narrow(x, dim, self.index * size, size)


class AllToAllKernel(CommCell):
    """Split ``x`` into ``n`` chunks along ``split_dim``; chunk ``j`` goes to rank ``j``, and the
    received chunks are concatenated along ``concat_dim`` in group order."""

    def __init__(self, group: ProcessGroup, split_dim: int, concat_dim: int):
        super().__init__()
        self.n, self.index = group.size, group.local_rank
        self.split_dim, self.concat_dim = split_dim, concat_dim
        if self.n == 1:
            self.mode = "identity"
        elif is_native("all_to_all", group):
            self.mode = "native"
            self.prim = ops.AlltoAll(split_count=self.n, split_dim=split_dim, concat_dim=concat_dim,
                                     group=group.name)
        else:
            self.mode = "emulated"
            self.gather = AllGatherKernel(group, 0)

    def construct(self, x):
        if self.mode == "identity":
            return x
        if self.mode == "native":
            return self.prim(x)
        split_dim = self.split_dim if self.split_dim >= 0 else self.split_dim + x.ndim
        concat_dim = self.concat_dim if self.concat_dim >= 0 else self.concat_dim + x.ndim
        size = x.shape[split_dim] // self.n
        everyone = self.gather(ops.expand_dims(x, 0))
        parts = ()
        for j in range(self.n):
            parts = parts + (ops.narrow(everyone[j], split_dim, self.index * size, size),)
        return ops.concat(parts, concat_dim)


class BroadcastKernel(CommCell):
    """Every rank gets ``src``'s ``x`` (``src`` is a global rank in the group)."""

    def __init__(self, group: ProcessGroup, src: int):
        super().__init__()
        if src not in group.ranks:
            raise ValueError(f"broadcast: src={src} is not in the group {list(group.ranks)}")
        self.n = group.size
        if self.n == 1:
            self.mode = "identity"
        elif is_native("broadcast", group):
            self.mode = "native"
            self.prim = ops.Broadcast(root_rank=group.ranks.index(src) if not group.is_world else src,
                                      group=group.name)
        else:
            self.mode = "emulated"
            self.reduce = _SumAllReduce(group)
            self.is_src = role_flag(group.rank == src)

    def construct(self, x):
        if self.mode == "identity":
            return x
        if self.mode == "native":
            return self.prim((x,))[0]
        return self.reduce(ops.select(self.is_src, x, ops.zeros_like(x)))


class ReduceToKernel(CommCell):
    """Sum over the group, kept on rank ``dst`` only (zeros elsewhere): broadcast's backward."""

    def __init__(self, group: ProcessGroup, dst: int):
        super().__init__()
        self.reduce = AllReduceKernel(group, "sum")
        self.is_dst = role_flag(group.rank == dst)

    def construct(self, x):
        y = self.reduce(x)
        return ops.select(self.is_dst, y, ops.zeros_like(y))


def pair_group(rank: int, peer: int) -> ProcessGroup:
    """The cached two-rank group used to emulate point-to-point on CPU."""
    return new_group(sorted((rank, peer)))


class SendKernel(CommCell):
    """Send ``x`` to global rank ``dst``; returns a value that must be kept alive (``ops.depend``)."""

    def __init__(self, world: ProcessGroup, dst: int, tag: int = 0):
        super().__init__()
        _check_peer("send", "dst", world, dst)
        if is_native("send", world):
            self.mode = "native"
            self.prim = ops.Send(sr_tag=tag, dest_rank=dst, group=world.name)
        elif _pair_is_world_with_broadcast(world):
            self.mode = "broadcast"
            self.prim = ops.Broadcast(root_rank=world.rank, group=world.name)
        else:
            self.mode = "emulated"
            self.reduce = _SumAllReduce(pair_group(world.rank, dst))

    def construct(self, x):
        if self.mode == "native":
            return self.prim(x)
        if self.mode == "broadcast":
            return self.prim((x,))[0]
        return self.reduce(x)


def _pair_is_world_with_broadcast(world: ProcessGroup) -> bool:
    """Two ranks in all with a native world broadcast (CPU): point-to-point as a broadcast from
    the sender, measured cheaper than the two-rank all-reduce (bench/pipeline_p2p.py: 16 KB 1.4
    vs 3.5 ms, 4 MB 23 vs 29 ms with a sync each)."""
    return world.size == 2 and is_native("broadcast", world)


class RecvKernel(CommCell):
    """Receive a tensor shaped like the argument from global rank ``src``."""

    def __init__(self, world: ProcessGroup, src: int, shape, dtype, tag: int = 0):
        super().__init__()
        _check_peer("recv", "src", world, src)
        self.shape, self.dtype = tuple(shape), dtype
        if is_native("recv", world):
            self.mode = "native"
            self.prim = ops.Receive(sr_tag=tag, src_rank=src, shape=list(shape), dtype=dtype,
                                    group=world.name)
        elif _pair_is_world_with_broadcast(world):
            self.mode = "broadcast"
            self.prim = ops.Broadcast(root_rank=src, group=world.name)
        else:
            self.mode = "emulated"
            self.reduce = _SumAllReduce(pair_group(world.rank, src))

    def construct(self, like):
        if self.mode == "native":
            return ops.depend(self.prim(), like)
        if self.mode == "broadcast":
            return self.prim((ops.zeros_like(like),))[0]
        return self.reduce(ops.zeros_like(like))


def _check_peer(what, arg, world, peer):
    if peer not in world.ranks or peer == world.rank:
        raise ValueError(f"{what}: {arg}={peer} must be another rank in [0, {world.size}) "
                         f"(this rank is {world.rank})")
