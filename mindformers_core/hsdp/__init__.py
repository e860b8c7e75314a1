"""hsdp: ZeRO level1/2/3 (optimizer states, gradients, parameters) over the data-parallel domain."""
from .api import hsdp
from .cell import HSDPCell, TrainStep
from .pipeline import HSDPStages, PipelineTrainStep, hsdp_stages, stage_dp_ranks
from .plan import (LEVELS, ParamPlan, check_stage_dp_ranks, describe, plan_param, shard_rank_lists, validate,
                   zero_bytes)

__all__ = ["HSDPCell", "HSDPStages", "LEVELS", "ParamPlan", "PipelineTrainStep", "TrainStep",
           "check_stage_dp_ranks", "describe", "hsdp", "hsdp_stages", "plan_param", "shard_rank_lists",
           "stage_dp_ranks", "validate", "zero_bytes"]
