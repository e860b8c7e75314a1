"""Layouts, placements, redistribution plans, op sharding rules and distributed tensors."""
from .layout import Layout, Partial, Placement, Replicate, Shard, as_layout
from .dtensor import DTensor, device_mesh_of, execute_plan, reshard, shard_tensor
from .redistribution import RedistributionPlan, Step, apply_plan_numpy, plan_redistribution
from .rules import (LocalKernel, NoRuleError, RuleError, RuleResult, get_rule, infer, register_rule,
                    registered_ops)

__all__ = ["DTensor", "Layout", "LocalKernel", "NoRuleError", "Partial", "Placement",
           "RedistributionPlan", "Replicate", "RuleError", "RuleResult", "Shard", "Step",
           "apply_plan_numpy", "as_layout", "device_mesh_of", "execute_plan", "get_rule", "infer",
           "plan_redistribution", "register_rule", "registered_ops", "reshard", "shard_tensor"]
