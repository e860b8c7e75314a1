"""Collectives as functions on a group, each with its backward, usable in PyNative and ms.jit.

Every call resolves to a cached Cell (per group, attributes and emulation choice), so repeated
calls reuse one compiled kernel and ``ms.jit`` sees only compile-time constants.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import mindspore as ms
from mindspore import ops

from ..process_group import ProcessGroup, resolve_group, world_group
from . import autograd as A
from . import kernels as K
from .capabilities import emulation_forced

_CELLS: Dict[Tuple[Any, ...], Any] = {}


def cached_comm_cell(key, build):
    """The collective Cell ``build()`` makes for ``key``, built once per process (and per emulation
    mode) so that every caller of one collective on one group shares its Cell."""
    key = key + (emulation_forced(),)
    cell = _CELLS.get(key)
    if cell is None:
        cell = build()
        _CELLS[key] = cell
    return cell


def clear_cache() -> None:
    """Forget cached collective Cells (e.g. after ``destroy_distributed``)."""
    _CELLS.clear()


class Work:
    """Handle of an asynchronous collective: ``wait()`` returns its result.

    MindSpore dispatches operators asynchronously in PyNative; the handle holds the output
    tensor, and ``wait()`` synchronizes on it.
    """

    def __init__(self, result):
        self._result = result

    def wait(self):
        if hasattr(self._result, "asnumpy"):
            self._result.asnumpy()  # blocks until the collective has produced its output
        return self._result

    def is_completed(self) -> bool:
        return True


def _maybe_async(result, async_op: bool):
    return Work(result) if async_op else result


def _split_size(what: str, x, dim: int, n: int) -> int:
    d = dim if dim >= 0 else dim + len(x.shape)
    if not 0 <= d < len(x.shape):
        raise ValueError(f"{what}: dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
    if x.shape[d] % n:
        raise ValueError(f"{what}: size {x.shape[d]} of dim {dim} (shape {tuple(x.shape)}) is not "
                         f"divisible by the group size {n}")
    return d


def all_reduce(x, op: str = "sum", group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Reduce over the group (``sum``, ``avg``, ``max``, ``min``); every rank gets the result."""
    g = resolve_group(group)
    if op in ("sum", "avg"):
        cell = cached_comm_cell(("all_reduce", g.ranks, op), lambda: A.Differentiable(
            K.AllReduceKernel(g, op), K.AllReduceKernel(g, op)))
    elif op in ("max", "min"):
        cell = cached_comm_cell(("all_reduce", g.ranks, op), lambda: A.AllReduceExtremum(g, op))
    else:
        raise ValueError(f"all_reduce: op={op!r}; valid ops are 'sum', 'avg', 'max', 'min'")
    return _maybe_async(cell(x), async_op)


def all_gather(x, dim: int = 0, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Concatenate every rank's ``x`` along ``dim``; backward reduce-scatters the gradient."""
    g = resolve_group(group)
    cell = cached_comm_cell(("all_gather", g.ranks, dim), lambda: A.Differentiable(
        K.AllGatherKernel(g, dim), K.ReduceScatterKernel(g, dim)))
    return _maybe_async(cell(x), async_op)


def reduce_scatter(x, dim: int = 0, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Sum over the group and keep this rank's slice along ``dim``; backward all-gathers."""
    g = resolve_group(group)
    _split_size("reduce_scatter", x, dim, g.size)
    cell = cached_comm_cell(("reduce_scatter", g.ranks, dim), lambda: A.Differentiable(
        K.ReduceScatterKernel(g, dim), K.AllGatherKernel(g, dim)))
    return _maybe_async(cell(x), async_op)


def all_to_all(x, split_dim: int, concat_dim: int, group: Optional[ProcessGroup] = None,
               async_op: bool = False):
    """Chunk ``j`` of ``x`` along ``split_dim`` goes to group rank ``j``; received chunks are
    concatenated along ``concat_dim``. Backward is the all-to-all with the dims swapped."""
    g = resolve_group(group)
    _split_size("all_to_all", x, split_dim, g.size)
    cell = cached_comm_cell(("all_to_all", g.ranks, split_dim, concat_dim), lambda: A.Differentiable(
        K.AllToAllKernel(g, split_dim, concat_dim), K.AllToAllKernel(g, concat_dim, split_dim)))
    return _maybe_async(cell(x), async_op)


def broadcast(x, src: int, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Every rank gets global rank ``src``'s ``x``; backward sums the gradients onto ``src``."""
    g = resolve_group(group)
    cell = cached_comm_cell(("broadcast", g.ranks, src), lambda: A.Differentiable(
        K.BroadcastKernel(g, src), K.ReduceToKernel(g, src)))
    return _maybe_async(cell(x), async_op)


def send(x, dst: int, async_op: bool = False):
    """Send ``x`` to global rank ``dst``. Returns a zero scalar token; adding it to the loss makes
    the backward receive ``x``'s gradient from ``dst`` (whose ``recv`` sends it back)."""
    world = world_group()
    cell = cached_comm_cell(("send", dst, tuple(x.shape), str(x.dtype)),
                            lambda: A.Send(world, dst, tuple(x.shape), x.dtype))
    return _maybe_async(cell(x), async_op)


def recv(like, src: int, async_op: bool = False):
    """Receive from global rank ``src`` a tensor with ``like``'s shape and dtype; backward sends
    the gradient back to ``src``."""
    world = world_group()
    cell = cached_comm_cell(("recv", src, tuple(like.shape), str(like.dtype)),
                            lambda: A.Recv(world, src, tuple(like.shape), like.dtype))
    return _maybe_async(cell(like), async_op)


def isend(x, dst: int) -> Work:
    return send(x, dst, async_op=True)


def irecv(like, src: int) -> Work:
    return recv(like, src, async_op=True)


def barrier(group: Optional[ProcessGroup] = None) -> None:
    """Block until every rank of the group arrives (an all-reduce of one element, synchronized)."""
    g = resolve_group(group)
    if g.size == 1:
        return
    kernel = cached_comm_cell(("barrier", g.ranks), lambda: K.AllReduceKernel(g, "sum"))
    kernel(ops.ones((1,), ms.float32)).asnumpy()

