"""hsdp: ZeRO level1/2/3 (optimizer states, gradients, parameters) over the data-parallel domain."""
from .api import HSDPCell, TrainStep, hsdp
from .plan import LEVELS, ParamPlan, describe, plan_param, shard_rank_lists, validate, zero_bytes

__all__ = ["HSDPCell", "LEVELS", "ParamPlan", "TrainStep", "describe", "hsdp", "plan_param",
           "shard_rank_lists", "validate", "zero_bytes"]
