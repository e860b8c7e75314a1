"""Layouts, placements and redistribution plans (pure logic; execution lives with the collectives)."""
from .layout import Layout, Partial, Placement, Replicate, Shard, as_layout
from .dtensor import DTensor, execute_plan, mesh_of, reshard, shard_tensor
from .redistribution import RedistributionPlan, Step, apply_plan_numpy, plan_redistribution

__all__ = ["DTensor", "execute_plan", "mesh_of", "reshard", "shard_tensor", "Layout", "Partial", "Placement", "RedistributionPlan", "Replicate", "Shard", "Step",
           "apply_plan_numpy", "as_layout", "plan_redistribution"]
