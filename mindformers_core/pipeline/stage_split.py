"""Cutting a full model down to one pipeline stage (``split_model``).

Which layers a stage holds is decided in :mod:`mindformers_core.common.placement`
(``stage_layer_ranges`` / ``layers_of_stage``); this module applies such a choice to a Cell.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

from ..common.placement import LayerIds, as_layer_list, format_layer_ranges, stage_layer_ranges


def split_model(model, stage_index: int, stage_num: int, layers_attr: str = "layers",
                first_attrs: Sequence[str] = ("embedding",), last_attrs: Sequence[str] = ("output",),
                layer_ids: Optional[LayerIds] = None):
    """Cut a full model down to stage ``stage_index`` in place and return it.

    Keeps the layers ``layer_ids`` (global indices into ``model.<layers_attr>``, a CellList,
    SequentialCell or CellDict; default: a uniform split over ``stage_num``), sets ``first_attrs``
    to None unless this is the first stage and ``last_attrs`` unless it is the last. The model's
    ``construct`` must skip attributes that are None. Kept parameters keep their full-model names
    (``layers.5.weight``), so a stage's checkpoint lines up with the whole model's.
    """
    from mindspore import nn  # the rest of this module needs no MindSpore

    if not isinstance(model, nn.Cell):
        raise TypeError(f"split_model: model must be a mindspore.nn.Cell, got {type(model).__name__}")
    if not isinstance(stage_num, int) or isinstance(stage_num, bool) or stage_num < 1:
        raise ValueError(f"stage split: stage_num={stage_num!r} must be a positive integer")
    if not isinstance(stage_index, int) or not 0 <= stage_index < stage_num:
        raise ValueError(f"split_model: stage_index={stage_index!r} must be in [0, {stage_num})")
    layers = getattr(model, layers_attr, None)
    if not isinstance(layers, (nn.CellList, nn.SequentialCell, nn.CellDict)):
        raise TypeError(f"split_model: model.{layers_attr} is {type(layers).__name__}; it must be an nn.CellList, "
                        "nn.SequentialCell or nn.CellDict (set layers_attr to the attribute holding the layers)")
    drop = [a for a in first_attrs if stage_index != 0] + [a for a in last_attrs if stage_index != stage_num - 1]
    absent = [a for a in list(first_attrs) + list(last_attrs) if not hasattr(model, a)]
    if absent:
        raise ValueError(f"split_model: model has no attribute(s) {absent} (first_attrs/last_attrs); its "
                         f"sub-cells are {list(model.name_cells())}")
    n = len(layers)
    if layer_ids is None:
        if n % stage_num:
            raise ValueError(f"split_model: model.{layers_attr} has {n} layers, not divisible by stage_num="
                             f"{stage_num}; pass layer_ids (e.g. from layers_of_stage(..., layers_per_stage=...))")
        ids = list(stage_layer_ranges(n, stage_num)[stage_index])
    else:
        ids = as_layer_list(layer_ids, "split_model: layer_ids")
        if ids and ids[-1] >= n:
            raise ValueError(f"split_model: layer_ids '{format_layer_ranges(ids)}' go beyond the model's {n} layers "
                             f"(model.{layers_attr} has indices 0..{n - 1})")
    names = {id(p): p.name for p in model.get_parameters()}
    if isinstance(layers, nn.CellDict):
        keys = list(layers.keys())
        kept = nn.CellDict(OrderedDict((keys[i], layers[keys[i]]) for i in ids))
    else:
        kept = type(layers)([layers[i] for i in ids])
    setattr(model, layers_attr, kept)
    for attr in drop:
        setattr(model, attr, None)
    for p in model.get_parameters():   # setattr renamed them after their new position
        p.name = names[id(p)]
    return model
