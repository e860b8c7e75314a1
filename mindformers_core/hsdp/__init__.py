"""hsdp: ZeRO level1/2/3 (optimizer states, gradients, parameters) over the data-parallel domain.

The package is callable: ``mindformers_core.hsdp(cell, ...)`` is ``hsdp.api.hsdp`` (its signature
is this module's ``__signature__``, so ``inspect.signature`` and tools reading it show the real
parameters; ``help()`` lists it first below)."""
import inspect
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


# the package's call signature is the function's (inspect.signature reads __signature__ before
# falling back to __call__'s (*args, **kwargs)); help() shows it and the function's docstring first
__signature__ = inspect.signature(hsdp)
__doc__ = f"hsdp{__signature__}\n\n{inspect.getdoc(hsdp)}\n\n{__doc__}"
sys.modules[__name__].__class__ = _CallablePackage
