"""Which ranks form an hsdp data-parallel group: resolved from an explicit group, the "dp" axis of a
``parallelize`` sharding plan, parallel_state, or the world -- without creating any group."""
from __future__ import annotations

from typing import List, Optional

from ..distributed.env import get_env
from ..distributed.process_group import ProcessGroup
from ..sharding.annotations import sharding_plan_of


def plan_dp_ranks(cell) -> Optional[List[int]]:
    """For a model sharded by ``parallelize``: this rank's ranks along the plan's "dp" axis."""
    plan = sharding_plan_of(cell)
    if plan is None:
        return None
    groups = getattr(plan.mesh, "axis_groups", None) or {}
    axes = tuple(groups["dp"]) if "dp" in groups else ("dp",) if "dp" in plan.mesh.alias_name else None
    if axes is None:     # e.g. the expert mesh names "dp" as the axis group ("edp", "ep")
        return None
    from ..sharding.dtensor import device_mesh_of
    mesh = device_mesh_of(plan.mesh)
    return list(mesh.group_ranks(axes))


def dp_ranks(dp_group, cell=None) -> List[int]:
    """The data-parallel ranks, without creating any group."""
    if dp_group is None and cell is not None and plan_dp_ranks(cell) is not None:
        return plan_dp_ranks(cell)
    if dp_group is None:
        from ..distributed import parallel_state
        if parallel_state.model_parallel_is_initialized():
            return list(parallel_state.get_data_parallel_group(with_context_parallel=True).ranks)
        return list(range(get_env().world_size))
    if isinstance(dp_group, ProcessGroup):
        return list(dp_group.ranks)
    if isinstance(dp_group, (list, tuple, range)):
        ranks = [int(r) for r in dp_group]
        if not ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"hsdp: dp_group={list(dp_group)} must be a non-empty list of distinct ranks")
        return ranks
    raise TypeError(f"hsdp: dp_group={dp_group!r} must be a ProcessGroup, a list of ranks or None")
