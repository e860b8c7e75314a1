"""A distributed tensor: this rank's shard plus the layout and global shape it belongs to.

``shard_tensor`` cuts a global tensor (the same on every rank) into the local shard,
``reshard`` moves a DTensor to another layout by executing the planner's steps with the
collectives of ``distributed.comm``, and ``full_tensor`` reassembles the global value. Plans are
plain Python decided before any data flows, so the same code runs in PyNative and under ms.jit.

Gradients through ``reshard`` are those of the collectives it runs (each collective's adjoint:
the sum of all ranks' losses is what is differentiated).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import ops

from ..distributed import comm
from ..distributed.comm.functional import cached_comm_cell
from ..distributed.comm.kernels import CommCell, role_flag
from ..distributed.device_mesh import DeviceMesh
from ..distributed.env import get_env
from .layout import Layout, Placement, as_layout
from .redistribution import RedistributionPlan, plan_redistribution

_MESHES: Dict[tuple, DeviceMesh] = {}


def device_mesh_of(layout: Layout) -> DeviceMesh:
    """The DeviceMesh (groups created lazily, cached) over a layout's device matrix."""
    key = (layout.device_matrix, layout.alias_name, tuple(layout.rank_list))
    mesh = _MESHES.get(key)
    if mesh is None:
        mesh = DeviceMesh(layout.device_matrix, layout.alias_name, layout.rank_list)
        _MESHES[key] = mesh
    return mesh


def layout_from_placements(mesh: DeviceMesh, placements: Sequence[Placement], ndim: int) -> Layout:
    """The ``Layout`` of an ``ndim`` tensor placed on ``mesh`` by per-mesh-axis ``placements``."""
    return Layout.from_placements(mesh.shape, mesh.dim_names, placements, ndim, mesh.rank_list)


class _KeepOnFirst(CommCell):
    """Replicated -> partial(sum): the rank at coordinate 0 of the axis keeps the value."""

    def __init__(self, first: bool):
        super().__init__()
        self.flag = role_flag(first)

    def construct(self, x):
        return ops.select(self.flag, x, ops.zeros_like(x))


def execute_plan(plan: RedistributionPlan, local):
    """Run ``plan`` on this rank's shard ``local``; returns the shard in the target layout.

    Across disjoint rank lists, source ranks return the send token and target ranks (whose
    ``local`` only supplies the dtype) the received shard."""
    layout = plan.source
    rank = get_env().rank
    x = local
    receiving_only = rank not in layout.rank_list
    for step in plan.steps:
        if step.kind == "p2p":
            x = _point_to_point(plan, x, rank)
            continue
        if receiving_only:
            continue  # the source stage's ranks run these steps before sending
        group = device_mesh_of(layout).get_group(step.axis)
        if step.kind == "all_reduce":
            x = comm.all_reduce(x, step.op, group)
        elif step.kind == "reduce_scatter":
            x = comm.reduce_scatter(x, step.dim, group)
        elif step.kind == "all_gather":
            x = comm.all_gather(x, step.dim, group)
        elif step.kind == "all_to_all":
            x = comm.all_to_all(x, step.dim_to, step.dim, group)
        elif step.kind == "slice":
            size = x.shape[step.dim] // group.size
            x = ops.narrow(x, step.dim, group.local_rank * size, size)
        elif step.kind == "zero_partial":
            first = group.local_rank == 0
            x = cached_comm_cell(("keep_on_first", group.ranks, first), lambda: _KeepOnFirst(first))(x)
        else:
            raise ValueError(f"execute_plan: unknown step {step.kind!r}")
    return x


def _point_to_point(plan: RedistributionPlan, x, rank: int):
    src, dst = plan.source.rank_list, plan.target.rank_list
    if set(src) & set(dst):
        raise ValueError(f"reshard across rank lists {src} -> {dst}: they overlap; only disjoint "
                         "meshes (pipeline stages) are supported")
    if rank in src:
        return comm.send(x, dst[src.index(rank)])
    like = ops.zeros(plan.target.local_shape(plan.shape), x.dtype)
    return comm.recv(like, src[dst.index(rank)])


class DTensor:
    """This rank's shard (``to_local()``), its ``layout`` and the global ``shape``."""

    def __init__(self, local, layout: Layout, shape: Sequence[int]):
        layout = as_layout(layout)
        shape = tuple(int(s) for s in shape)
        expected = layout.local_shape(shape)
        if tuple(local.shape) != expected:
            raise ValueError(f"DTensor: local shard has shape {tuple(local.shape)} but layout "
                             f"{layout.describe()} of global shape {shape} needs {expected}")
        self._local, self.layout, self.shape = local, layout, shape

    def to_local(self):
        return self._local

    @property
    def placements(self) -> Tuple[Placement, ...]:
        return self.layout.placements()

    @property
    def dtype(self):
        return self._local.dtype

    def redistribute(self, target: Union[Layout, Sequence[Placement]]) -> "DTensor":
        return reshard(self, target)

    def full_tensor(self):
        """The global tensor on every rank (all partial axes reduced, all shards gathered)."""
        base = Layout(self.layout.device_matrix, self.layout.alias_name, self.layout.rank_list)
        return reshard(self, base(*["None"] * len(self.shape))).to_local()

    def __repr__(self) -> str:
        return f"DTensor(shape={self.shape}, layout={self.layout!r}, local={tuple(self._local.shape)})"


def _target_layout(dtensor_or_mesh_layout: Layout, target, ndim: int) -> Layout:
    if isinstance(target, (list, tuple)) and target and not isinstance(target[0], str):
        mesh = device_mesh_of(dtensor_or_mesh_layout)
        return layout_from_placements(mesh, target, ndim)
    return as_layout(target)


def shard_tensor(tensor, mesh: Optional[DeviceMesh] = None,
                 placements: Optional[Sequence[Placement]] = None,
                 layout: Optional[Layout] = None, name: str = "tensor") -> DTensor:
    """Cut a global ``tensor`` (identical on every rank) into this rank's shard.

    Give either ``mesh`` and ``placements`` or a tensor ``layout``. Partial placements keep the
    value on the first rank of each partial axis (zeros elsewhere), so the sum is the tensor.
    """
    if layout is None:
        if mesh is None or placements is None:
            raise ValueError("shard_tensor: give a layout, or a mesh and placements")
        layout = layout_from_placements(mesh, placements, len(tensor.shape))
    layout = as_layout(layout)
    shape = tuple(tensor.shape)
    layout.check_shape(shape, name)
    rank = get_env().rank
    local = tensor[layout.local_slice(shape, rank)] if len(shape) else tensor
    if layout.partial:
        coord = layout.coordinate(rank)
        if any(coord[a] != 0 for a in layout.partial):
            local = ops.zeros_like(local)
    return DTensor(local, layout, shape)


def reshard(dtensor: DTensor, target: Union[Layout, Sequence[Placement]]) -> Optional[DTensor]:
    """Move ``dtensor`` to ``target`` (a layout, or placements on the same mesh).

    Between disjoint rank lists (pipeline stages) the source ranks send and get ``None`` back.
    """
    target_layout = _target_layout(dtensor.layout, target, len(dtensor.shape))
    itemsize = np.dtype(ms.dtype_to_nptype(dtensor.dtype)).itemsize
    plan = plan_redistribution(dtensor.layout, target_layout, dtensor.shape, itemsize)
    local = execute_plan(plan, dtensor.to_local())
    if get_env().rank not in target_layout.rank_list:
        local.asnumpy()  # make sure the send completed before the caller moves on
        return None
    return DTensor(local, target_layout, dtensor.shape)
