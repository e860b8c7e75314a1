"""``apply_recompute(model, config)`` and ``apply_swap(model, config)``: choose Cells by strings and
turn every match into a recompute / swap unit, with no change to the model code.

::

    report = apply_recompute(model, RecomputeConfig(mode="select",
                             select=["layers.*.self_attention.core_attention", ".*mlp.*act"], layers="0-3,8-11"))
    print(report)                                   # what matched, what was skipped and why
    apply_recompute(model, "full")                  # every transformer layer
    apply_recompute(stage, {"recompute": [2, 1], "select_recompute": True})    # MindFormers keys
    apply_swap(model, SwapConfig(select=["core_attention"]))

``plan_recompute`` / ``plan_swap`` return the same report without touching the model. See
docs/recompute.md.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional, Tuple

from mindspore import nn

from ..common.placement import stage_layer_ranges
from .config import (MF_RECOMPUTE_KEYS, MF_SWAP_KEYS, RecomputeConfig, StageMap, SwapConfig, from_mindformers,
                     swap_from_mindformers)
from .patterns import PatternError
from .plan import Report, Tree, ancestors, parent_of, resolve
from .units import set_recompute, set_swap

_CONTAINERS = (nn.CellList, nn.SequentialCell, nn.CellDict)
_LAYER_NAME = re.compile(r"(?:(.*)\.)?layers\.(\d+)")


def _cell_of(model):
    """A Cell, or the Cell of a pipeline stage (anything with a ``.cell``)."""
    cell = getattr(model, "cell", model) if not isinstance(model, nn.Cell) else model
    if not isinstance(cell, nn.Cell):
        raise TypeError(f"expected a mindspore.nn.Cell or a PipelineStage, got {type(model).__name__}")
    return cell


def model_tree(model) -> Tree:
    """The :class:`Tree` of ``model``: its qualified Cell names, containers, transformer layers (global
    ids from ``layer_number``, else the index plus the stage's layer offset) and their blocks."""
    cell = _cell_of(model)
    named = list(cell.cells_and_names())
    cells = dict(named)
    containers = frozenset(n for n, c in named if isinstance(c, _CONTAINERS))
    layers, blocks = {}, []
    for n, c in named:
        m = _LAYER_NAME.fullmatch(n)
        if not m or parent_of(n) not in containers:
            continue
        number = getattr(c, "layer_number", None)
        if isinstance(number, int) and not isinstance(number, bool):
            lid = number - 1
        else:
            block = cells.get(m.group(1) or "")
            lid = int(m.group(2)) + int(getattr(getattr(block, "stage", None), "offset", 0) or 0)
        layers[n] = lid
        block_name = m.group(1) or ""
        if block_name not in blocks:
            blocks.append(block_name)
    classes = {n: type(c).__name__ for n, c in named}
    return Tree([n for n, _ in named], containers, layers, blocks, classes, owner=type(cell).__name__)


def stage_map(model) -> Optional[StageMap]:
    """The pipeline layer split MindFormers' per-stage counts refer to, from the model's config
    (``config.num_layers``, ``pipeline_model_parallel_size``, virtual stages, and a Llama config's
    ``layers_per_stage()`` offsets); None when the model has no such config."""
    cfg = getattr(_cell_of(model), "config", None)
    if cfg is None or not hasattr(cfg, "num_layers"):
        return None
    pp = getattr(cfg, "pipeline_model_parallel_size", 1) or 1
    vpp = getattr(cfg, "virtual_pipeline_model_parallel_size", None)
    per_stage = cfg.layers_per_stage() if callable(getattr(cfg, "layers_per_stage", None)) else None
    return StageMap(tuple(stage_layer_ranges(cfg.num_layers, pp, vpp, per_stage)), pp)


def _field_names(cls):
    return {f.name for f in dataclasses.fields(cls)}


def _from_mapping(kind: str, config: Mapping, mf_keys, cls, from_mf):
    """A mapping of MindFormers ``<kind>_config`` keys (``from_mf()``) or of ``cls`` fields, not a mix."""
    keys = set(config)
    if keys <= set(mf_keys):
        return from_mf()
    if keys <= _field_names(cls):
        return cls(**config)
    unknown = sorted(keys - set(mf_keys) - _field_names(cls))
    what = f"unknown key(s) {unknown}" if unknown else f"keys {sorted(keys)} mix the two kinds"
    raise PatternError(f"{kind} config: {what}; give MindFormers {kind}_config keys {list(mf_keys)} or "
                       f"{cls.__name__} fields {sorted(_field_names(cls) - {'notes'})}")


def as_recompute_config(config: Any, model=None, swap_config: Optional[Mapping] = None) -> RecomputeConfig:
    """``config`` as a :class:`RecomputeConfig`: one already; None/False/"none"; True/"full"; "select";
    a list of patterns (select mode); a mapping of MindFormers ``recompute_config`` keys or of
    RecomputeConfig fields."""
    if isinstance(config, RecomputeConfig):
        return config
    if config is None or config is False:
        return RecomputeConfig(mode="none")
    if config is True:
        return RecomputeConfig(mode="full")
    if isinstance(config, str):
        if config in ("none", "select", "full"):
            return RecomputeConfig(mode=config)
        return RecomputeConfig(mode="select", select=[config])
    if isinstance(config, (list, tuple)):
        return RecomputeConfig(mode="select", select=list(config))
    if isinstance(config, Mapping):
        return _from_mapping("recompute", config, MF_RECOMPUTE_KEYS, RecomputeConfig, lambda: from_mindformers(
            config, stage_map(model) if model is not None else None, swap_config))
    raise TypeError(f"recompute config: {config!r} is not a RecomputeConfig, mode string, pattern list or mapping")


def as_swap_config(config: Any) -> Optional[SwapConfig]:
    """``config`` as a :class:`SwapConfig` (None = no swap): one already; None/False; True (the
    default: attention cores); a list of patterns; a mapping of MindFormers ``swap_config`` keys or
    of SwapConfig fields."""
    if isinstance(config, SwapConfig):
        return config
    if config is None or config is False:
        return None
    if config is True:
        return SwapConfig()
    if isinstance(config, str):
        return SwapConfig(select=[config])
    if isinstance(config, (list, tuple)):
        return SwapConfig(select=list(config))
    if isinstance(config, Mapping):
        return _from_mapping("swap", config, MF_SWAP_KEYS, SwapConfig, lambda: swap_from_mindformers(config))
    raise TypeError(f"swap config: {config!r} is not a SwapConfig, pattern list or mapping")


def plan_recompute(model, config: Any = "select", swap_config: Optional[Mapping] = None) -> Report:
    """What :func:`apply_recompute` would do, without touching the model."""
    return _plan_recompute(model, as_recompute_config(config, model, swap_config))


def _plan_recompute(model, cfg: RecomputeConfig) -> Report:
    rules, exclusions = cfg.rules()
    report = resolve(model_tree(model), rules, exclusions, cfg.strict, "recompute", cfg.notes)
    if cfg.slice_activation:
        report.notes.append("recompute_slice_activation: set on the Cells for MindSpore auto-parallel graph mode; "
                            "no effect in this package's runtime")
    return report


def apply_recompute(model, config: Any = "select", swap_config: Optional[Mapping] = None) -> Report:
    """Turn the Cells ``config`` chooses into recompute units (see :class:`RecomputeConfig`); returns
    the :class:`Report`. ``model`` is a Cell or a PipelineStage (its stage Cell). ``swap_config`` is
    only read for MindFormers' rule that layer lists are indices when swap is on."""
    cell = _cell_of(model)
    cfg = as_recompute_config(config, cell, swap_config)
    report = _plan_recompute(cell, cfg)
    cells = dict(cell.cells_and_names())
    for unit in report.units:
        target = cells[unit.name]
        if any(getattr(c, "_mfc_swap", None) is not None for n, c in cells.items()
               if n == unit.name or n.startswith(unit.name + ".")):
            report.notes.append(f"{unit.name}: also (inside) a swap unit; inside a recompute unit nothing is saved "
                                "in the forward, so that swap only acts during the recomputation")
        set_recompute(target, unit.name, cfg.slice_activation)
    return report


def plan_swap(model, config: Any = True) -> Report:
    """What :func:`apply_swap` would do, without touching the model."""
    return _plan_swap(model, as_swap_config(config))


def _plan_swap(model, cfg: Optional[SwapConfig]) -> Report:
    if cfg is None:
        return Report("swap", notes=["swap is off"])
    rules, exclusions = cfg.rules()
    report = resolve(model_tree(model), rules, exclusions, cfg.strict, "swap", cfg.notes)
    cells = dict(_cell_of(model).cells_and_names())
    kept = []
    for unit in report.units:
        names = [unit.name] + ancestors(unit.name)
        rec = next((n for n in names if getattr(cells.get(n), "_mfc_recompute", None) is not None), None)
        if rec is not None:
            report.skipped.append((unit.name, f"inside recompute unit {rec or '<root>'}: nothing is saved there "
                                              "for backward (recompute wins, as in MindFormers)"))
        else:
            kept.append(unit)
    report.units = kept
    return report


def apply_swap(model, config: Any = True) -> Report:
    """Turn the Cells ``config`` chooses into swap units (see :class:`SwapConfig`); returns the
    :class:`Report`. Apply recompute first: swap units inside recompute units are skipped."""
    cell = _cell_of(model)
    cfg = as_swap_config(config)
    report = _plan_swap(cell, cfg)
    if cfg is None:
        return report
    cells = dict(cell.cells_and_names())
    prefetch = cfg.prefetch.get("default", 1) if isinstance(cfg.prefetch, Mapping) else cfg.prefetch
    for unit in report.units:
        set_swap(cells[unit.name], unit.name, prefetch)
    return report


def apply_mindformers(model, recompute_config: Optional[Mapping] = None,
                      swap_config: Optional[Mapping] = None) -> Tuple[Report, Report]:
    """Both YAML sections as MindFormers users write them: recompute first, then swap."""
    rec = apply_recompute(model, dict(recompute_config or {}), swap_config)
    swp = apply_swap(model, dict(swap_config or {}) or None)
    return rec, swp
