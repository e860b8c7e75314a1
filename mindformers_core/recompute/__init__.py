"""Recompute and swap chosen by string-matched Cell names; the model code does not change.

``apply_recompute(model, config)`` / ``apply_swap(model, config)`` resolve exact names, globs and
regular expressions over qualified Cell names (optionally restricted to layer ranges such as
"0-3,8-11"), or MindFormers' ``recompute_config`` / ``swap_config`` keys, and turn every match into a
recompute / swap unit; they return a report of what matched. Works in PyNative and under ``ms.jit``
(see docs/recompute.md for what each mode does).
"""
from .api import (apply_mindformers, apply_recompute, apply_swap, as_recompute_config, as_swap_config,
                  model_tree, plan_recompute, plan_swap, stage_map)
from .config import (DEFAULT_SELECT, DEFAULT_SWAP, RecomputeConfig, Rule, StageMap, SwapConfig, from_mindformers,
                     swap_from_mindformers)
from .meter import ActivationMeter, allocator_peak
from .patterns import Layers, Pattern, PatternError, compile_pattern, layers_of, translate_mindformers
from .plan import Report, Tree, Unit, resolve
from .units import RecomputeFunction, SwapFunction

__all__ = ["ActivationMeter", "DEFAULT_SELECT", "DEFAULT_SWAP", "Layers", "Pattern", "PatternError", "RecomputeConfig",
           "RecomputeFunction", "Report", "Rule", "StageMap", "SwapConfig", "SwapFunction", "Tree", "Unit",
           "allocator_peak", "apply_mindformers", "apply_recompute", "apply_swap", "as_recompute_config",
           "as_swap_config", "compile_pattern", "from_mindformers", "layers_of", "model_tree", "plan_recompute",
           "plan_swap", "resolve", "stage_map", "swap_from_mindformers",
           "translate_mindformers"]
