"""``plan_sharding`` and ``parallelize``: trace, propagate, then shard the model in place.

Steps: trace one forward on global shapes (PyNative, full weights) → collect ``shard(config)``
declarations → propagate → (``parallelize`` only) replace every parameter by this rank's shard,
slice constants, swap atomic Cells that need a local kernel, and wrap Cells whose boundaries carry
a redistribution. The model code is not touched; the returned object is the model itself.

Each parameter records its global layout, global shape and grad axes (mesh axes its gradient must
still be summed over -- ``GradientReducer`` does it; the data-parallel axis is among them for every
replicated weight): read them with ``annotations.layout_of`` / ``global_shape_of`` / ``grad_axes_of``.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
from mindspore import Parameter, Tensor, nn

from ..distributed.comm import kernels as K
from ..distributed.comm.functional import cached_comm_cell
from .annotations import (annotate_parameter, grad_axes_of, layout_of, set_sharding_plan,
                          sharding_plan_of)
from .boundary import Passthrough, Redistribute, ShardedCall, wrap_root
from .dtensor import device_mesh_of
from .layout import Layout, as_layout
from .expert_parallel import expert_mesh
from . import local_kernels  # noqa: F401  (registers the kernels not yet next to their rule)
from .propagation import PlanError, ShardingPlan, collect_declarations, propagate
from .rules.registry import KernelError, KernelSite, local_kernel
from .styles import plan_declarations
from .trace import Graph, trace


def mesh_layout(config=None, mesh=None) -> Layout:
    """The device-matrix layout to plan on: ``mesh`` (a Layout, ``mindspore.parallel.Layout`` or
    DeviceMesh) or the sizes in ``config`` (``data_parallel_size``/``tensor_model_parallel_size``/
    ``context_parallel_size`` attributes or dict keys, MindFormers' ``data_parallel``/
    ``model_parallel``/``context_parallel`` too) as axes ("dp", "cp", "tp")."""
    if mesh is not None:
        if hasattr(mesh, "shape") and hasattr(mesh, "dim_names"):
            return Layout(tuple(mesh.shape), tuple(mesh.dim_names), list(mesh.rank_list))
        return as_layout(mesh)

    def get(*names, default=1):
        for n in names:
            v = config.get(n) if isinstance(config, dict) else getattr(config, n, None)
            if v is not None:
                return int(v)
        return default

    if config is None:
        raise ValueError("parallelize: give a config with the parallel sizes or a mesh")
    dp = get("data_parallel_size", "data_parallel", "dp")
    cp = get("context_parallel_size", "context_parallel", "cp")
    tp = get("tensor_model_parallel_size", "model_parallel", "tp")
    ep = get("expert_model_parallel_size", "expert_parallel", "ep")
    for name, v in (("data_parallel_size", dp), ("context_parallel_size", cp), ("tensor_model_parallel_size", tp),
                    ("expert_model_parallel_size", ep)):
        if v < 1:
            raise ValueError(f"parallelize: {name}={v} must be >= 1")
    if ep > 1:
        return expert_mesh(dp, cp, tp, ep)
    return Layout((dp, cp, tp), ("dp", "cp", "tp"))


def default_input_layouts(graph: Graph, mesh: Layout) -> List[Layout]:
    """Batch (dim 0) over "dp" and, for inputs of 2+ dims, the sequence (dim 1) over "cp" when the
    mesh has them (context parallelism: tokens in storage order), the rest replicated."""
    out = []
    for tid in graph.inputs:
        nd = len(graph.shape(tid))
        dims = ["None"] * nd
        if nd and mesh.has_axis("dp") and mesh.axis_size("dp") > 1:
            dims[0] = "dp"      # with expert parallelism "dp" is the axis group ("edp", "ep")
        if nd >= 2 and "cp" in mesh.alias_name and mesh.axis_size("cp") > 1:
            dims[1] = "cp"
        out.append(mesh(*dims))
    return out


def plan_sharding(model: nn.Cell, config=None, *sample_inputs, mesh=None, plan: Optional[Mapping] = None,
                  input_layouts: Optional[Sequence] = None, output_layouts: Optional[Sequence] = None
                  ) -> ShardingPlan:
    """Trace ``model`` on ``sample_inputs`` (global shapes: Tensors, arrays or ``(shape, dtype)``)
    and propagate layouts. Nothing is communicated and the model is not changed. ``plan`` maps
    Cell-name patterns to styles (``ColWiseParallel()``...) for models without ``shard()``; a
    style overrides the matched Cell's own ``shard()``."""
    base = mesh_layout(config, mesh)
    if sharding_plan_of(model) is not None:
        raise PlanError("this model is already parallelized; plan the original, unsharded model")
    styled = plan_declarations(model, plan, base) if plan else {}
    graph = trace(model, *sample_inputs)
    declarations = collect_declarations(graph, config)
    declarations.update(styled)
    ins = list(input_layouts) if input_layouts is not None else default_input_layouts(graph, base)
    return propagate(graph, base, declarations, ins, list(output_layouts or ()))


def parallelize(model: nn.Cell, config=None, *sample_inputs, mesh=None, rank: Optional[int] = None,
                plan: Optional[Mapping] = None, input_layouts: Optional[Sequence] = None,
                output_layouts: Optional[Sequence] = None, sharding_plan: Optional[ShardingPlan] = None) -> nn.Cell:
    """Shard ``model`` in place for this rank and return it (``sharding_plan_of(model)`` gives the
    plan). Call it on every rank with the same model (the same initial weights: each rank keeps
    its slice of the full weights it holds, so seed or load them), config and sample shapes. ``plan``: styles by
    Cell-name pattern for models without ``shard()`` (see ``styles.py``); ``sharding_plan``: a plan
    made earlier by :func:`plan_sharding`. The model then
    takes this rank's local input shards (``plan.input_layouts``) and returns local output shards
    (``plan.output_layouts``)."""
    if sharding_plan is None:
        sharding_plan = plan_sharding(model, config, *sample_inputs, mesh=mesh, plan=plan,
                                      input_layouts=input_layouts, output_layouts=output_layouts)
    plan = sharding_plan
    if rank is None:
        from ..distributed.env import get_env
        rank = get_env().rank
    if rank not in plan.mesh.rank_list:
        raise ValueError(f"parallelize: rank {rank} is not in the mesh's ranks {list(plan.mesh.rank_list)} "
                         f"{dict(zip(plan.mesh.alias_name, plan.mesh.device_matrix))}")
    _check_executable(plan)
    _shard_parameters(model, plan, rank)
    _shard_constants(plan, rank)
    _install(model, plan, rank)
    set_sharding_plan(model, plan)
    return model


def _check_executable(plan: ShardingPlan) -> None:
    g = plan.graph
    for index, res in plan.results.items():
        if res.local is None:
            continue
        node, kernel = g.nodes[index], local_kernel(res.local.name)
        if kernel is not None and kernel.shape_from_input:
            continue   # model code computes the target shape from x.shape (documented contract)
        if node.cell is None:
            raise PlanError(f"{node.describe()} needs the local kernel {res.local.name!r}, which only runs "
                            f"for an atomic Cell (a Cell with `sharding_op`); move the op into one")
        if kernel is None:
            raise PlanError(f"{node.describe()}: local kernel {res.local.name!r} is not implemented")
    for name, layout in plan.param_layouts.items():
        if layout.partial:
            raise PlanError(f"parameter {name} would need the partial layout {layout.describe()} (added once "
                            f"per partial addend); reduce the partial before it, e.g. declare the output "
                            f"layout of the Cell that produces the other operand")
    for tid, layout in plan.const_layouts.items():
        if layout.partial:
            raise PlanError(f"constant {g.tensors[tid].name} would need the partial layout {layout.describe()}")
    calls_per_cell: Dict[int, List[int]] = {}
    for call in g.calls:
        calls_per_cell.setdefault(id(call.cell), []).append(call.index)
    for indices in calls_per_cell.values():
        if len(indices) > 1:
            signatures = {tuple((r.source, r.target, r.grad_partial) for r in plan.redistributions_of(i))
                          for i in indices}
            if len(signatures) > 1:
                path = g.calls[indices[0]].path
                raise PlanError(f"Cell {path} is called {len(indices)} times with different boundary "
                                f"redistributions; one Cell object can carry one set — use separate Cells")


def forget_cached_shapes() -> None:
    """Drop PyNative's cached abstracts after Parameters changed shape in place.

    PyNative caches the abstract (shape, dtype) of every tensor that enters a primitive run
    through the infer path (e.g. ``BiasAdd``, ``ZerosLike``; not the pyboost kernels such as
    ``MatMul``), keyed by the tensor's id. ``Parameter.set_data(..., slice_shape=True)`` keeps that
    id, so an op run after the shrink sees the pre-shard shape: ``nn.Dense``'s ``BiasAdd`` failed
    with "bias[0] shape should be equal to input_x[1]" and ``ops.zeros_like(param)`` returned the
    full shape (measured, MindSpore 2.10.0, one process as well as msrun). The trace runs the
    model on full weights, so every parallelized model has such entries. ``clear_res`` is the only
    exposed way to clear that cache; it also drops PyNative's compiled single-op kernels (rebuilt
    on next use). Measured: tensor hooks (``register_hook``) and ``ms.jit`` graphs compiled before
    it keep working. Call it only between steps, never while a forward or backward is recorded."""
    from mindspore.graph.api import _pynative_executor
    _pynative_executor.clear_res()


def _shard_parameters(model: nn.Cell, plan: ShardingPlan, rank: int) -> None:
    params = {p.name: p for p in model.get_parameters()}
    resized = False
    for name, layout in plan.param_layouts.items():
        p = params[name]
        shape = tuple(int(d) for d in p.shape)
        annotate_parameter(p, layout, shape, plan.grad_axes.get(name, ()))
        if layout.sharded_axes():
            local = p.asnumpy()[layout.local_slice(shape, rank)]
            p.set_data(Tensor(np.ascontiguousarray(local)), slice_shape=True)
            resized = True
    if resized:
        forget_cached_shapes()


def _shard_constants(plan: ShardingPlan, rank: int) -> None:
    for tid, layout in plan.const_layouts.items():
        if layout.sharded_axes():
            cell, attr = plan.graph.consts[tid]
            value = getattr(cell, attr)
            local = value.asnumpy()[layout.local_slice(tuple(value.shape), rank)]
            setattr(cell, attr, Tensor(np.ascontiguousarray(local)))


def _local_kernel(plan: ShardingPlan, call, rank: int) -> Optional[nn.Cell]:
    """The kernel Cell registered for the call's ``RuleResult.local`` (``rules.register_local_kernel``)."""
    node = plan.graph.nodes[call.node]
    res = plan.results[node.index]
    if res.local is None:
        return None
    kernel = local_kernel(res.local.name)
    if kernel is None or kernel.factory is None:
        raise PlanError(f"{node.describe()}: local kernel {res.local.name!r} is not implemented")
    try:
        return kernel.factory(KernelSite(node, res, call.cell, rank, plan.graph))
    except KernelError as e:
        raise PlanError(f"{node.describe()}: {e}") from None


def _conversion(plan: ShardingPlan, node_index: int):
    for r in plan.redistributions:
        if r.node == node_index:
            return Redistribute(r.forward, r.backward, r.grad_scale, r.where)
    return Passthrough()


def _install(model: nn.Cell, plan: ShardingPlan, rank: int) -> None:
    g = plan.graph
    names = {id(p): p.name for p in model.get_parameters()}
    done = set()
    parents = {}
    for path, cell in model.cells_and_names():
        for key, child in cell._cells.items():
            if child is not None:
                parents[id(child)] = (cell, key)
    for call in g.calls:
        if id(call.cell) in done:
            continue
        done.add(id(call.cell))
        n_args = max([g.nodes[n].arg for n in call.enter] + [-1]) + 1
        pre = [Passthrough() for _ in range(n_args)]
        for n in call.enter:
            pre[g.nodes[n].arg] = _conversion(plan, n)
        post = [_conversion(plan, n) for n in call.exit]
        active = any(not isinstance(c, Passthrough) for c in pre + post)
        kernel = _local_kernel(plan, call, rank) if call.atomic else None
        if call.index == 0:
            if kernel is not None:
                raise PlanError("the model itself is an atomic Cell with a local kernel; wrap it in a Cell")
            if active:
                wrap_root(model, pre, post, len(call.exit) == 1)
            continue
        if not active and kernel is None:
            continue
        inner = kernel if kernel is not None else call.cell
        replacement = ShardedCall(inner, pre, post, len(call.exit) == 1) if active else inner
        parent, key = parents[id(call.cell)]
        parent._cells[key] = replacement
        if key in parent.__dict__:
            object.__setattr__(parent, key, replacement)
    for p in model.get_parameters():
        if id(p) in names:
            p.name = names[id(p)]


def _sum_over(group) -> nn.Cell:
    return cached_comm_cell(("raw_all_reduce", group.ranks, "sum"), lambda: K.AllReduceKernel(group, "sum"))


class GradientReducer(nn.Cell):
    """Sums each gradient over the mesh axes in its parameter's ``grad_axes_of`` (minus
    ``skip_axes``: e.g. ("dp",) when hsdp or the pipeline runtime reduces over data parallel).
    A Cell, so it runs the same in PyNative and inside ``ms.jit``."""

    def __init__(self, params: Sequence[Parameter], skip_axes: Sequence[str] = ()):
        super().__init__(auto_prefix=False)
        cells = []
        self.axes = []
        for p in params:
            axes = tuple(a for a in grad_axes_of(p) if a not in skip_axes)
            self.axes.append(axes)
            cells.append(_sum_over(device_mesh_of(layout_of(p)).get_group(axes)) if axes else Passthrough())
        self.reducers = nn.CellList(cells)
        self.count = len(cells)
        # nothing to sum (one process, or every axis skipped): the gradients pass unchanged, without
        # one Passthrough Cell call per parameter (about 20 ms per step in PyNative for a 39-parameter Llama)
        self.identity = not any(self.axes)

    def construct(self, grads):
        if self.identity:
            return grads
        out = ()
        for i in range(self.count):
            out = out + (self.reducers[i](grads[i]),)
        return out
