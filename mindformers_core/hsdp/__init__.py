"""hsdp: ZeRO level1/2/3 (optimizer states, gradients, parameters) over the data-parallel domain."""
import sys

from .api import hsdp
from .cell import HSDPCell, HsdpTrainStep, hsdp_update
from .pipeline import HSDPStages, PipelineTrainStep, hsdp_stages, stage_dp_ranks
from .plan import (LEVELS, ParamPlan, check_hsdp_arguments, check_stage_dp_ranks, plan_param, plan_table,
                   shard_rank_lists, zero_bytes)

__all__ = ["HSDPCell", "HSDPStages", "HsdpTrainStep", "LEVELS", "ParamPlan", "PipelineTrainStep",
           "check_hsdp_arguments", "check_stage_dp_ranks", "hsdp", "hsdp_stages", "hsdp_update", "plan_param",
           "plan_table", "shard_rank_lists", "stage_dp_ranks", "zero_bytes"]


class _CallablePackage(type(sys.modules[__name__])):
    """``mindformers_core.hsdp(cell, ...)`` is ``hsdp.api.hsdp``: the public name ``hsdp`` and this
    package's name are the same attribute of ``mindformers_core``, so the package itself is callable."""

    def __call__(self, *args, **kwargs):
        return hsdp(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
