"""Where pipeline stages sit and which transformer layers each holds: pure Python, no MindSpore.

**Stages to ranks.** With ``pp`` ranks and ``v`` stages per rank there are ``pp * v`` stages,
numbered in model order. A placement is the tuple ``rank_of[stage]``:

* ``"interleaved"`` (alias ``"loop"``, Megatron's virtual pipeline): stage ``s`` on rank
  ``s % pp``; the model loops over the ranks ``v`` times.
* ``"v"``: the loops alternate direction, so stage ``s`` of chunk ``c = s // pp`` sits on rank
  ``s % pp`` for even ``c`` and ``pp - 1 - s % pp`` for odd ``c``. With ``v = 2`` that is the
  V shape of ZBV/DualPipeV: rank 0 holds the first and the last stage, and the turn at the bottom
  of the V (stages ``pp - 1`` and ``pp``) stays on one rank.

**Layers to stages.** Stage ``s`` holds one contiguous run of layers (possibly none), stage 0 also
the embedding and stage ``S - 1`` the output layer and loss, so activations only ever flow from
stage s to s + 1. With the default ``"interleaved"`` placement pipeline rank ``r``'s virtual stage
``v`` is stage ``v * pp + r`` (Megatron's layout). Layer splits: uniform (``num_layers`` divisible
by S), counts per stage (``[3, 5, 5, 3]``), layer lists per stage (``["0-2", "3-7", ...]``), or,
with virtual stages, one list per pipeline rank (``["0-3,8-11", "4-7,12-15"]``): each rank's layers
must then form exactly ``vpp`` runs, which go to its virtual stages in model order.

It lives below every package because the model (``transformer``), the memory strategies
(``recompute``), the pipeline runtime and the trainer all need the same answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

PLACEMENTS = ("interleaved", "loop", "v")
PlacementSpec = Union[str, Sequence[int]]


def _check_positive(owner: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name}={value!r} must be a positive integer")


def stage_placement(placement: PlacementSpec, pp_size: int, stages_per_rank: int = 1) -> Tuple[int, ...]:
    """``rank_of[stage]`` for a named placement, or an explicit sequence checked for shape."""
    _check_positive("stage_placement", "pp_size", pp_size)
    _check_positive("stage_placement", "stages_per_rank", stages_per_rank)
    stage_num = pp_size * stages_per_rank
    if isinstance(placement, str):
        kind = placement.lower()
        if kind in ("interleaved", "loop"):
            return tuple(s % pp_size for s in range(stage_num))
        if kind == "v":
            return tuple(s % pp_size if (s // pp_size) % 2 == 0 else pp_size - 1 - s % pp_size
                         for s in range(stage_num))
        raise ValueError(f"stage_placement: placement={placement!r}; valid names are {list(PLACEMENTS)} "
                         "or a sequence giving the rank of each stage")
    ranks = tuple(placement)
    if len(ranks) != stage_num or any(not isinstance(r, int) or not 0 <= r < pp_size for r in ranks):
        raise ValueError(f"stage_placement: placement={list(ranks)} must list {stage_num} ranks "
                         f"in [0, {pp_size}) (one per stage)")
    if any(ranks.count(r) != stages_per_rank for r in range(pp_size)):
        raise ValueError(f"stage_placement: placement={list(ranks)} must give every rank exactly "
                         f"{stages_per_rank} stage(s)")
    return ranks


LayerIds = Union[str, Sequence[int]]   # "0-3,8-11" or increasing layer indices
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


def as_layer_list(spec: LayerIds, where: str) -> List[int]:
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
        lists = [as_layer_list(e, f"stage split: layers_per_stage[{i}]") for i, e in enumerate(entries)]
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
