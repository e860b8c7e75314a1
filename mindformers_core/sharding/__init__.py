"""Layouts, placements, redistribution plans, op sharding rules and distributed tensors."""
from .layout import Layout, Partial, Placement, Replicate, Shard, as_layout
from .dtensor import DTensor, execute_plan, mesh_of, reshard, shard_tensor
from .redistribution import RedistributionPlan, Step, apply_plan_numpy, plan_redistribution
from .rules import (LocalKernel, NoRuleError, RuleError, RuleResult, get_rule, infer, register_rule,
                    registered_ops)

__all__ = ["DTensor", "Layout", "LocalKernel", "NoRuleError", "Partial", "Placement",
           "RedistributionPlan", "Replicate", "RuleError", "RuleResult", "Shard", "Step",
           "apply_plan_numpy", "as_layout", "execute_plan", "get_rule", "infer", "mesh_of",
           "plan_redistribution", "register_rule", "registered_ops", "reshard", "shard_tensor"]
