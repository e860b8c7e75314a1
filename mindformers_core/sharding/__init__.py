"""Layouts, placements, redistribution plans, op sharding rules and distributed tensors."""
from .layout import Layout, Partial, Placement, Replicate, Shard, as_layout
from .dtensor import DTensor, device_mesh_of, execute_plan, reshard, shard_tensor
from .redistribution import RedistributionPlan, Step, apply_plan_numpy, plan_redistribution
from .rules import (LocalKernel, NoRuleError, RuleError, RuleResult, get_rule, infer, register_rule,
                    registered_ops)
from .annotations import sharding_plan_of
from .parallelizer import GradientReducer, parallelize, plan_sharding
from .styles import ColWiseParallel, ExpertParallel, NoParallel, PrepareInput, RowWiseParallel, SequenceParallel
from .expert_parallel import expert_mesh

__all__ = ["ColWiseParallel", "DTensor", "ExpertParallel", "expert_mesh", "GradientReducer", "Layout", "LocalKernel", "NoRuleError", "Partial", "Placement",
           "RedistributionPlan", "Replicate", "RuleError", "RuleResult", "Shard", "Step",
           "apply_plan_numpy", "as_layout", "device_mesh_of", "execute_plan", "get_rule", "infer",
           "NoParallel", "parallelize", "plan_redistribution", "plan_sharding", "PrepareInput", "register_rule",
           "registered_ops", "reshard", "RowWiseParallel", "SequenceParallel", "shard_tensor", "sharding_plan_of"]
