"""Which transformer layers each pipeline (virtual) stage holds, and cutting a model down to one stage.

With ``pp`` ranks and ``vpp`` virtual stages per rank there are ``S = pp * vpp`` stages in model
order. Stage ``s`` holds one contiguous run of layers (possibly none), stage 0 also the embedding and
stage ``S - 1`` the output layer and loss, so activations only ever flow from stage s to s + 1.
Which rank runs stage s is the placement of :mod:`.stage`; with the default ``"interleaved"``
placement pipeline rank ``r``'s virtual stage ``v`` is stage ``v * pp + r`` (Megatron's layout).

Layer splits: uniform (``num_layers`` divisible by S), counts per stage (``[3, 5, 5, 3]``), layer
lists per stage (``["0-2", "3-7", ...]``), or, with virtual stages, one list per pipeline rank
(``["0-3,8-11", "4-7,12-15"]``): each rank's layers must then form exactly ``vpp`` runs, which go to
its virtual stages in model order. Everything here is plain Python except ``split_model``.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from .stage import PlacementSpec, stage_placement

LayerSpec = Union[str, Sequence[int]]
_TOKEN = re.compile(r"(\d+)(?:\s*-\s*(\d+))?")


def parse_layer_ranges(text: str) -> List[int]:
    """``"0-3,8-11"`` -> ``[0, 1, 2, 3, 8, 9, 10, 11]``: inclusive ranges or single indices, in
    increasing order, not overlapping. ``""`` is a stage without transformer layers."""
    if not isinstance(text, str):
        raise TypeError(f"parse_layer_ranges: expected a string such as '0-3,8-11', got {type(text).__name__}")
    layers: List[int] = []
    if not text.strip():
        return layers
    for token in (t.strip() for t in text.split(",")):
        match = _TOKEN.fullmatch(token)
        if not match:
            raise ValueError(f"parse_layer_ranges: bad token {token!r} in {text!r}; write comma-separated layer "
                             "indices or inclusive ranges, e.g. '0-3,8-11' or '5'")
        lo, hi = int(match[1]), int(match[2] or match[1])
        if hi < lo:
            raise ValueError(f"parse_layer_ranges: range {token!r} in {text!r} goes down; write it as '{hi}-{lo}'")
        if layers and lo <= layers[-1]:
            twice = sorted(set(range(lo, hi + 1)) & set(layers))
            raise ValueError(f"parse_layer_ranges: {text!r} lists layer(s) {twice} twice" if twice else
                             f"parse_layer_ranges: {token!r} comes after layer {layers[-1]} in {text!r}; "
                             "list ranges in increasing order")
        layers.extend(range(lo, hi + 1))
    return layers


def format_layer_ranges(layers: Sequence[int]) -> str:
    """The inverse of :func:`parse_layer_ranges`: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    layers, parts, i = list(layers), [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        parts.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(parts)


def _as_layers(spec: LayerSpec, where: str) -> List[int]:
    """A layer list from a range string or a sequence of increasing ints."""
    if isinstance(spec, str):
        return parse_layer_ranges(spec)
    if isinstance(spec, (list, tuple, range)) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                      for i in spec):
        layers = list(spec)
        if any(b <= a for a, b in zip(layers, layers[1:])):
            raise ValueError(f"{where}: layers {layers} must be strictly increasing (no repeats)")
        return layers
    raise TypeError(f"{where}: {spec!r} is not a layer list; give a string such as '0-3,8-11' or a list of "
                    "non-negative ints")


def _positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"stage split: {name}={value!r} must be a positive integer")
    return value


def _runs(owner_of: List[int]):
    """``[(owner, length), ...]`` of consecutive equal owners."""
    runs: List[List[int]] = []
    for owner in owner_of:
        if runs and runs[-1][0] == owner:
            runs[-1][1] += 1
        else:
            runs.append([owner, 1])
    return [tuple(r) for r in runs]


def _counts_from_lists(num_layers: int, lists: List[List[int]], per_rank: bool, rank_of) -> List[int]:
    kind = "pipeline rank" if per_rank else "stage"
    owner_of: List[Optional[int]] = [None] * num_layers
    for i, layers in enumerate(lists):
        for layer in layers:
            if layer >= num_layers:
                raise ValueError(f"stage split: layer {layer} of layers_per_stage[{i}] is out of range for "
                                 f"num_layers={num_layers}")
            if owner_of[layer] is not None:
                raise ValueError(f"stage split: layer {layer} is in layers_per_stage[{owner_of[layer]}] and "
                                 f"layers_per_stage[{i}]; every layer must belong to exactly one {kind}")
            owner_of[layer] = i
    missing = [layer for layer, o in enumerate(owner_of) if o is None]
    if missing:
        raise ValueError(f"stage split: layers {missing} are in no entry of layers_per_stage; every layer "
                         f"0..{num_layers - 1} must belong to exactly one {kind}")
    runs = _runs(owner_of)
    if not per_rank:
        order = [owner for owner, _ in runs]
        for stage in sorted(set(order)):
            if order.count(stage) > 1:
                raise ValueError(f"stage split: the layers of stage {stage} ('{format_layer_ranges(lists[stage])}') "
                                 "are not consecutive; a stage holds one run of consecutive layers (with virtual "
                                 "stages give one entry per pipeline rank instead)")
        for s, t in zip(order, order[1:]):
            if t < s:
                raise ValueError(f"stage split: stage {t}'s layers '{format_layer_ranges(lists[t])}' come after "
                                 f"stage {s}'s '{format_layer_ranges(lists[s])}'; stages hold layers in model order")
        return [len(layers) for layers in lists]
    expected = list(rank_of)
    got = [owner for owner, _ in runs]
    if got != expected:
        raise ValueError(f"stage split: in model order the layers run over pipeline ranks {got}, but the "
                         f"{len(expected)} stages sit on ranks {expected}; each rank's entry must form exactly "
                         f"{len(expected) // len(lists)} runs of consecutive layers, one per virtual stage "
                         "(or give one entry per stage)")
    return [length for _, length in runs]


def stage_layer_ranges(num_layers: int, pp_size: int, vpp_size: Optional[int] = None,
                       layers_per_stage: Optional[Sequence] = None,
                       placement: PlacementSpec = "interleaved") -> List[range]:
    """The layers of every stage, ``result[s]`` for stage ``s`` in model order."""
    _positive("num_layers", num_layers)
    pp, vpp = _positive("pp_size", pp_size), _positive("vpp_size", 1 if vpp_size is None else vpp_size)
    stage_num = pp * vpp
    rank_of = stage_placement(placement, pp, vpp)
    if layers_per_stage is None:
        if num_layers % stage_num:
            raise ValueError(f"stage split: num_layers={num_layers} is not divisible by pp_size={pp} x "
                             f"vpp_size={vpp} = {stage_num} stages; pass layers_per_stage (layer counts or "
                             "layer ranges per stage)")
        counts = [num_layers // stage_num] * stage_num
    elif isinstance(layers_per_stage, str) or not isinstance(layers_per_stage, (list, tuple)):
        raise TypeError(f"stage split: layers_per_stage={layers_per_stage!r} must be a list: layer counts per "
                        "stage, or layer lists/ranges per stage (or per pipeline rank with virtual stages)")
    elif all(isinstance(c, int) and not isinstance(c, bool) for c in layers_per_stage):
        counts = list(layers_per_stage)
        if len(counts) != stage_num or min(counts) < 0 or sum(counts) != num_layers:
            raise ValueError(f"stage split: layer counts {counts} must be {stage_num} non-negative numbers (one "
                             f"per stage: pp_size={pp} x vpp_size={vpp}) summing to num_layers={num_layers}")
    else:
        entries = list(layers_per_stage)
        per_rank = vpp > 1 and len(entries) == pp
        if len(entries) != stage_num and not per_rank:
            raise ValueError(f"stage split: layers_per_stage has {len(entries)} entries; give one per stage "
                             f"({stage_num} = pp_size {pp} x vpp_size {vpp})"
                             + (f" or one per pipeline rank ({pp})" if vpp > 1 else ""))
        if per_rank and any(a == b for a, b in zip(rank_of, rank_of[1:])):
            raise ValueError(f"stage split: placement {placement!r} puts consecutive stages on one rank "
                             f"({list(rank_of)}), so per-rank layer lists are ambiguous; give one entry per stage")
        lists = [_as_layers(e, f"stage split: layers_per_stage[{i}]") for i, e in enumerate(entries)]
        counts = _counts_from_lists(num_layers, lists, per_rank, rank_of)
    starts = [sum(counts[:s]) for s in range(stage_num)]
    return [range(start, start + count) for start, count in zip(starts, counts)]


@dataclass(frozen=True)
class StageLayers:
    """What one (virtual) stage holds: its global ``layers``, ``offset`` (global index of its first
    layer, Megatron's layer offset), and whether it has the embedding / the output layer and loss."""
    stage_index: int
    stage_num: int
    layers: List[int]
    offset: int
    has_embedding: bool
    has_output: bool


def layers_of_stage(num_layers: int, pp_size: int, pp_rank: int, vpp_size: Optional[int] = None,
                    vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None,
                    placement: PlacementSpec = "interleaved") -> StageLayers:
    """The layers of pipeline rank ``pp_rank``'s virtual stage ``vp_stage`` (see the module docstring)."""
    ranges = stage_layer_ranges(num_layers, pp_size, vpp_size, layers_per_stage, placement)
    vpp = len(ranges) // pp_size
    if not isinstance(pp_rank, int) or not 0 <= pp_rank < pp_size:
        raise ValueError(f"stage split: pp_rank={pp_rank!r} must be in [0, {pp_size}) for pp_size={pp_size}")
    if vp_stage is None and vpp > 1:
        raise ValueError(f"stage split: vpp_size={vpp}: say which virtual stage with vp_stage in [0, {vpp})")
    vp = 0 if vp_stage is None else vp_stage
    if not isinstance(vp, int) or not 0 <= vp < vpp:
        raise ValueError(f"stage split: vp_stage={vp_stage!r} must be in [0, {vpp}) for vpp_size={vpp}")
    s = [i for i, r in enumerate(stage_placement(placement, pp_size, vpp)) if r == pp_rank][vp]
    return StageLayers(s, len(ranges), list(ranges[s]), ranges[s].start, s == 0, s == len(ranges) - 1)


def get_transformer_layer_offset(num_layers: int, pp_size: int, pp_rank: int, vpp_size: Optional[int] = None,
                                 vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None,
                                 placement: PlacementSpec = "interleaved") -> int:
    """0-based global index of the first layer of a (virtual) stage (Megatron's offset)."""
    return layers_of_stage(num_layers, pp_size, pp_rank, vpp_size, vp_stage, layers_per_stage, placement).offset


def split_model(model, stage_index: int, stage_num: int, layers_attr: str = "layers",
                first_attrs: Sequence[str] = ("embedding",), last_attrs: Sequence[str] = ("output",),
                layer_ids: Optional[LayerSpec] = None):
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
    _positive("stage_num", stage_num)
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
        ids = _as_layers(layer_ids, "split_model: layer_ids")
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
