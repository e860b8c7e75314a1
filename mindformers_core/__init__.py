"""mindformers_core: the MindFormers parallel core as a pure-Python MindSpore extension.

The public API: every name the docs use, importable from here and resolved on first use (PEP 562),
so ``import mindformers_core`` stays cheap (MindSpore is imported only when a name needs it) and
cannot form an import cycle. Each name lives in one subpackage (the table below); the subpackages
stay importable on their own (``from mindformers_core.sharding import Layout``).
"""
from importlib import import_module

__version__ = "0.1.0"

# name -> the subpackage (or module) that exports it
_PUBLIC = {
    # distributed: msrun runtime, rank groups, device mesh, Megatron parallel state
    "DeviceMesh": "mindformers_core.distributed",
    "ProcessGroup": "mindformers_core.distributed",
    "RankGenerator": "mindformers_core.distributed",
    "destroy_distributed": "mindformers_core.distributed",
    "destroy_model_parallel": "mindformers_core.distributed",
    "get_env": "mindformers_core.distributed",
    "get_mesh": "mindformers_core.distributed",
    "init_distributed": "mindformers_core.distributed",
    "initialize_model_parallel": "mindformers_core.distributed",
    "new_group": "mindformers_core.distributed",
    "parallel_state": "mindformers_core.distributed",
    "set_mesh": "mindformers_core.distributed",
    # sharding: layouts, distributed tensors, Cell-level sharding and parallel styles
    "ColWiseParallel": "mindformers_core.sharding",
    "DTensor": "mindformers_core.sharding",
    "GradientReducer": "mindformers_core.sharding",
    "Layout": "mindformers_core.sharding",
    "NoParallel": "mindformers_core.sharding",
    "Partial": "mindformers_core.sharding",
    "PrepareInput": "mindformers_core.sharding",
    "Replicate": "mindformers_core.sharding",
    "RowWiseParallel": "mindformers_core.sharding",
    "SequenceParallel": "mindformers_core.sharding",
    "Shard": "mindformers_core.sharding",
    "parallelize": "mindformers_core.sharding",
    "plan_redistribution": "mindformers_core.sharding",
    "plan_sharding": "mindformers_core.sharding",
    "reshard": "mindformers_core.sharding",
    "shard_tensor": "mindformers_core.sharding",
    "sharding_plan_of": "mindformers_core.sharding",
    # transformer, optim, data, checkpoint
    "GPTModel": "mindformers_core.transformer",
    "TransformerConfig": "mindformers_core.transformer",
    "AdamW": "mindformers_core.optim",
    "LlamaTokenizer": "mindformers_core.data",
    "PackedDataset": "mindformers_core.data",
    "load_checkpoint": "mindformers_core.checkpoint",
    "save_checkpoint": "mindformers_core.checkpoint",
    # memory strategies and pipeline parallelism
    "RecomputeConfig": "mindformers_core.recompute",
    "SwapConfig": "mindformers_core.recompute",
    "apply_recompute": "mindformers_core.recompute",
    "apply_swap": "mindformers_core.recompute",
    "MetaStep": "mindformers_core.pipeline",
    "MetaStepType": "mindformers_core.pipeline",
    "PipelineStage": "mindformers_core.pipeline.runtime",
    "Schedule1F1B": "mindformers_core.pipeline",
    "ScheduleGPipe": "mindformers_core.pipeline",
    "ScheduleInterleaved1F1B": "mindformers_core.pipeline",
    "ScheduleZeroBubbleH1": "mindformers_core.pipeline",
    "ScheduleZeroBubbleV": "mindformers_core.pipeline",
    "ScheduleDualPipeV": "mindformers_core.pipeline",
    "StageInfo": "mindformers_core.pipeline",
    "build_schedule": "mindformers_core.pipeline",
    "simulate": "mindformers_core.pipeline",
    # models
    "LlamaConfig": "mindformers_core.models",
    "LlamaForCausalLM": "mindformers_core.models",
    "register_model": "mindformers_core.models",
    # training
    "ConfigError": "mindformers_core.training",
    "Trainer": "mindformers_core.training",
    "load_config": "mindformers_core.training",
}
# hsdp(cell, ...) is the hsdp package itself: the package is callable (see hsdp/__init__.py), so the
# name means the same whether or not the subpackage was imported first
_CALLABLE_PACKAGES = {"hsdp": "mindformers_core.hsdp"}

__all__ = sorted([*_PUBLIC, *_CALLABLE_PACKAGES])


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(import_module(_PUBLIC[name]), name)
    elif name in _CALLABLE_PACKAGES:
        value = import_module(_CALLABLE_PACKAGES[name])
    else:
        raise AttributeError(f"module 'mindformers_core' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})
