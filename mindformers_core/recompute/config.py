"""What to recompute or swap, as data: :class:`RecomputeConfig`, :class:`SwapConfig`, and the
translation of MindFormers' ``recompute_config`` / ``swap_config`` YAML sections into them.

Both configs normalize to a list of :class:`Rule` (``kind`` "full" or "select", a pattern or the
layers themselves, a layer selection) plus exclusion rules; :mod:`.plan` resolves rules against a
model's Cell names. Plain Python: no MindSpore needed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .patterns import (Layers, LayerSel, PatternError, compile_pattern, layer_relative, layers_of,
                       translate_mindformers)

# ``select`` mode without patterns: the two classic selective-recompute targets -- the attention
# core (scores/probabilities are O(s^2) per head: Megatron's "selective") and the MLP activation
# (MindFormers' select_recompute default). Both are cheap to recompute and large to keep.
DEFAULT_SELECT = ("self_attention.core_attention", "mlp.act")
# swap_config.swap: True without layer_swap/op_swap: MindFormers offloads every layer's attention core.
DEFAULT_SWAP = ("self_attention.core_attention",)
MODES = ("none", "select", "full")
GRANULARITIES = ("layer", "stage")

Patterns = Union[str, Sequence[str], Mapping[str, LayerSel]]


@dataclass(frozen=True)
class Rule:
    """``kind`` "full" (whole transformer layers, ``pattern`` None), "stage" (the block holding the
    layers, as one unit) or "select" (Cells matching ``pattern``), restricted to ``layers``;
    ``source`` says where it came from (for the report)."""
    kind: str
    pattern: Optional[str]
    layers: Layers
    source: str


def _patterns(value: Patterns, default_layers: LayerSel, where: str) -> List[Tuple[str, Layers]]:
    """``"p"`` / ``["p", ...]`` / ``{"p": layers, ...}`` -> ``[(pattern, Layers), ...]`` (validated)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        items = [(p, layers_of(sel, f"{where}[{p!r}]")) for p, sel in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(p, layers_of(default_layers, "layers")) for p in value]
    else:
        raise PatternError(f"{where}={value!r}: give a pattern, a list of patterns, or a mapping "
                           "{pattern: layer selection}")
    for p, _ in items:
        compile_pattern(p, where)
    return items


@dataclass
class RecomputeConfig:
    """What to recompute.

    * ``mode="full"``: every transformer layer in ``layers`` is one recompute unit (only its input
      is kept); with ``granularity="stage"`` the whole block of layers of this model / pipeline
      stage is one unit (only the stage input is kept).
    * ``mode="select"``: the Cells matching ``select`` (patterns, or ``{pattern: layers}``; default
      :data:`DEFAULT_SELECT`) inside ``layers`` (default: anywhere).
    * ``full_layers`` adds whole-layer recompute on those layers in select mode (MindFormers'
      ``recompute`` list next to ``select_recompute``); full recompute wins inside such a layer.
    * ``exclude``: Cells never recomputed; a whole-layer unit containing one is split into its
      sub-Cells off the excluded path.
    * ``strict``: a pattern that matches no Cell at all is an error (with close names).
    * ``slice_activation``: passed to MindSpore's ``Cell.recompute(recompute_slice_activation=...)``
      (an auto-parallel graph-mode attribute: no effect in this package's runtime).
    """
    mode: str = "select"
    select: Patterns = ()
    layers: LayerSel = None
    full_layers: LayerSel = False
    exclude: Patterns = ()
    granularity: str = "layer"
    strict: bool = True
    slice_activation: bool = False
    notes: List[str] = field(default_factory=list)

    def __post_init__(self):
        if self.mode not in MODES:
            raise PatternError(f"RecomputeConfig: mode={self.mode!r}; valid modes are {list(MODES)} "
                               "('full' = whole layers, 'select' = matched Cells only)")
        if self.granularity not in GRANULARITIES:
            raise PatternError(f"RecomputeConfig: granularity={self.granularity!r}; valid values are "
                               f"{list(GRANULARITIES)} ('layer' = each layer a unit, 'stage' = the whole block)")
        if self.granularity == "stage" and self.mode != "full":
            raise PatternError("RecomputeConfig: granularity='stage' recomputes the whole block of layers and "
                               f"needs mode='full' (got mode={self.mode!r})")
        layers_of(self.layers, "RecomputeConfig.layers")
        layers_of(self.full_layers, "RecomputeConfig.full_layers")
        if self.granularity == "stage" and layers_of(self.layers, "layers").ids:
            raise PatternError(f"RecomputeConfig: granularity='stage' recomputes every layer of the stage; "
                               f"layers={self.layers!r} must be None or 'all' (use granularity='layer' to "
                               "choose layers)")
        self.rules()   # validates patterns

    def rules(self) -> Tuple[List[Rule], List[Rule]]:
        """``(recompute rules, exclusion rules)``."""
        out: List[Rule] = []
        if self.mode == "full":
            sel = layers_of(True if self.layers is None else self.layers, "RecomputeConfig.layers")
            out.append(Rule("stage" if self.granularity == "stage" else "full", None, sel,
                            "mode='full'" + (", granularity='stage'" if self.granularity == "stage" else "")))
        elif self.mode == "select":
            select = self.select or DEFAULT_SELECT
            for p, sel in _patterns(select, self.layers, "RecomputeConfig.select"):
                out.append(Rule("select", p, sel, f"select {p!r}"))
            full = layers_of(self.full_layers, "RecomputeConfig.full_layers")
            if not full.empty:
                out.append(Rule("full", None, full, f"full_layers={self.full_layers!r}"))
        excl = [Rule("exclude", p, sel, f"exclude {p!r}")
                for p, sel in _patterns(self.exclude, None, "RecomputeConfig.exclude")]
        return out, excl


@dataclass
class SwapConfig:
    """What to swap: the activations saved for backward inside the matched Cells move to host
    memory when saved and come back when the backward needs them.

    * ``select``: patterns or ``{pattern: layers}`` (default :data:`DEFAULT_SWAP` when neither
      ``select`` nor ``layers`` is given), restricted to ``select_layers`` (default anywhere).
    * ``layers``: whole transformer layers to swap.
    * ``exclude``, ``strict`` as in :class:`RecomputeConfig`.
    * ``prefetch``: MindFormers' ``backward_prefetch`` (kept in the report: here the copy back is
      synchronous, right when the backward unpacks the tensor).
    """
    select: Patterns = ()
    select_layers: LayerSel = None
    layers: LayerSel = False
    exclude: Patterns = ()
    strict: bool = True
    prefetch: Any = 1
    notes: List[str] = field(default_factory=list)

    def __post_init__(self):
        layers_of(self.select_layers, "SwapConfig.select_layers")
        layers_of(self.layers, "SwapConfig.layers")
        self.rules()

    def rules(self) -> Tuple[List[Rule], List[Rule]]:
        out: List[Rule] = []
        whole = layers_of(self.layers, "SwapConfig.layers")
        select = self.select
        if not select and whole.empty:
            select = DEFAULT_SWAP
        for p, sel in _patterns(select, self.select_layers, "SwapConfig.select"):
            out.append(Rule("select", p, sel, f"swap {p!r}"))
        if not whole.empty:
            out.append(Rule("full", None, whole, f"layers={self.layers!r}"))
        excl = [Rule("exclude", p, sel, f"exclude {p!r}")
                for p, sel in _patterns(self.exclude, None, "SwapConfig.exclude")]
        return out, excl


# ---- MindFormers YAML -> configs ----------------------------------------------------------------
MF_RECOMPUTE_KEYS = ("recompute", "select_recompute", "select_comm_recompute", "recompute_slice_activation",
                     "select_recompute_exclude", "select_comm_recompute_exclude", "mp_comm_recompute",
                     "parallel_optimizer_comm_recompute")
MF_SWAP_KEYS = ("swap", "default_prefetch", "layer_swap", "op_swap")
_MF_SELECT_DEFAULT = (r"mlp\.mul", r"mlp\.activation_func\.silu")   # -> mlp.act
_MF_COMM_DEFAULT = (r".*\.norm",)                                   # -> the layer norms


@dataclass(frozen=True)
class StageMap:
    """The layer split MindFormers' per-stage counts refer to: ``ranges[s]`` = the global layers of
    stage ``s`` in model order; ``pp`` pipeline ranks (stage s runs on rank s % pp)."""
    ranges: Tuple[range, ...]
    pp: int

    @property
    def vpp(self) -> int:
        return len(self.ranges) // self.pp

    @property
    def num_layers(self) -> int:
        return sum(len(r) for r in self.ranges)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def mf_layers(value, stages: Optional[StageMap], key: str, as_indices: bool = False) -> LayerSel:
    """A MindFormers layer spec -> our layer selection. ``True``/``False``; a list of per-stage counts
    (``[2, 1]``: the first 2 layers of stage 0 and the first layer of stage 1; booleans mean all /
    none; with virtual stages a list per pipeline rank is spread over its virtual stages like
    MindFormers does, or give ``[[...], ...]`` per virtual stage); with swap on, a list of layer
    indices (``as_indices``)."""
    if isinstance(value, bool):
        return "all" if value else False
    if value is None:
        return False
    if not isinstance(value, (list, tuple)):
        raise PatternError(f"{key}={value!r}: give true/false or a list (per-stage layer counts)")
    if as_indices:
        if all(_is_int(v) for v in value):
            return list(value)
        raise PatternError(f"{key}={value!r}: with swap_config.swap true MindFormers reads this list as layer "
                           "indices; give ints")
    if stages is None:
        raise PatternError(f"{key}={value!r}: per-stage counts need the model's pipeline split; pass a model "
                           "built from a TransformerConfig (or stage_ranges=...)")
    counts = _stage_counts(value, stages, key)
    ids = [layer for s, rng in enumerate(stages.ranges) for layer in list(rng)[:counts[s]]]
    return ids


def _stage_counts(value, stages: StageMap, key: str) -> List[int]:
    pp, vpp, n_stages = stages.pp, stages.vpp, len(stages.ranges)
    sizes = [len(r) for r in stages.ranges]

    def count(v, cap):
        if isinstance(v, bool):
            return cap if v else 0
        if _is_int(v) and v >= 0:
            return min(v, cap)
        raise PatternError(f"{key}={value!r}: entries must be layer counts (ints >= 0) or booleans")

    value = list(value)
    if value and all(isinstance(v, (list, tuple)) for v in value):       # [vpp][pp]
        if len(value) != vpp or any(len(v) != pp for v in value):
            raise PatternError(f"{key}={value!r}: a nested list needs {vpp} rows (virtual stages) of {pp} "
                               "counts (pipeline ranks)")
        return [count(value[s // pp][s % pp], sizes[s]) for s in range(n_stages)]
    if len(value) == n_stages:
        return [count(v, sizes[s]) for s, v in enumerate(value)]
    if len(value) == pp and vpp > 1:   # per pipeline rank: spread round-robin over its virtual stages
        out = [0] * n_stages
        for rank, v in enumerate(value):
            left = count(v, sum(sizes[rank::pp]))
            while left:
                for chunk in range(vpp):
                    s = chunk * pp + rank
                    if left and out[s] < sizes[s]:
                        out[s] += 1
                        left -= 1
        return out
    raise PatternError(f"{key}={value!r}: give one count per pipeline stage ({n_stages}"
                       + (f", or one per pipeline rank ({pp})" if vpp > 1 else "") + ")")


def _mf_patterns(value, defaults, stages, key, as_indices) -> Tuple[Dict[str, LayerSel], List[str]]:
    """MindFormers select_* value -> ({our regex pattern: layers}, notes)."""
    if value is False or value is None:
        return {}, []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        items = [(p, True) for p in value]
    else:   # True or per-stage counts: the default patterns
        items = [(p, value) for p in defaults]
    out: Dict[str, LayerSel] = {}
    notes = []
    for pattern, spec in items:
        if not isinstance(pattern, str):
            raise PatternError(f"{key}: pattern {pattern!r} must be a string")
        new, note = translate_mindformers(pattern)
        if note:
            notes.append(f"{key}: {note}")
        sel = mf_layers(spec, stages, f"{key}[{pattern!r}]", as_indices)
        full = layer_relative(new)
        prev = out.get(full)
        out[full] = _union(prev, sel) if prev is not None else sel
    return out, notes


def _union(a: LayerSel, b: LayerSel) -> LayerSel:
    if a == "all" or b == "all":
        return "all"
    if a is False:
        return b
    if b is False:
        return a
    return sorted(set(a) | set(b))


def from_mindformers(recompute_config: Optional[Mapping[str, Any]], stages: Optional[StageMap] = None,
                     swap_config: Optional[Mapping[str, Any]] = None) -> RecomputeConfig:
    """MindFormers ``recompute_config`` -> :class:`RecomputeConfig`.

    ``recompute`` -> whole layers; ``select_recompute`` and ``select_comm_recompute`` -> select patterns
    (defaults: the MLP activation, resp. the layer norms), names translated from MindFormers' Llama;
    ``*_exclude`` -> exclusions; ``recompute_slice_activation`` passed on. As in MindFormers, full
    recompute wins inside a layer, and with ``swap_config.swap`` true layer lists are layer indices
    rather than per-stage counts."""
    cfg = dict(recompute_config or {})
    unknown = sorted(set(cfg) - set(MF_RECOMPUTE_KEYS))
    if unknown:
        raise PatternError(f"recompute_config: unknown key(s) {unknown}; known keys are {list(MF_RECOMPUTE_KEYS)}")
    as_indices = bool((swap_config or {}).get("swap", False))
    notes: List[str] = []
    full = mf_layers(cfg.get("recompute", False), stages, "recompute_config.recompute", as_indices)
    select, n1 = _mf_patterns(cfg.get("select_recompute", False), _MF_SELECT_DEFAULT, stages,
                              "recompute_config.select_recompute", as_indices)
    comm, n2 = _mf_patterns(cfg.get("select_comm_recompute", False), _MF_COMM_DEFAULT, stages,
                            "recompute_config.select_comm_recompute", as_indices)
    if comm:
        notes.append("select_comm_recompute: the model code has no communication operators (the sharding pass "
                     "inserts them at Cell boundaries), so its patterns choose Cells like select_recompute does")
    excl: Dict[str, LayerSel] = {}
    for key in ("select_recompute_exclude", "select_comm_recompute_exclude"):
        value = cfg.get(key, False)
        if value is True:
            raise PatternError(f"recompute_config.{key}=True: name the operators to exclude (a list of patterns "
                               "or a mapping {pattern: layers})")
        pats, n3 = _mf_patterns(value, (), stages, f"recompute_config.{key}", as_indices)
        excl.update(pats)
        notes += n3
    for key in ("mp_comm_recompute", "parallel_optimizer_comm_recompute"):
        if key in cfg:
            notes.append(f"recompute_config.{key}: accepted for compatibility; it concerns MindSpore auto-parallel "
                         "communication and has no effect here")
    merged = dict(select)
    for p, sel in comm.items():
        merged[p] = _union(merged[p], sel) if p in merged else sel
    merged = {p: s for p, s in merged.items() if s is not False and s != []}
    full_empty = full is False or full == []
    if merged:
        mode, select_arg, full_arg = "select", merged, full
    elif not full_empty:
        mode, select_arg, full_arg = "full", (), False
    else:
        mode, select_arg, full_arg = "none", (), False
    return RecomputeConfig(mode=mode, select=select_arg, layers=full if mode == "full" else None,
                           full_layers=full_arg if mode == "select" else False, exclude=excl,
                           slice_activation=bool(cfg.get("recompute_slice_activation", False)),
                           notes=notes + n1 + n2)


def swap_from_mindformers(swap_config: Optional[Mapping[str, Any]]) -> Optional[SwapConfig]:
    """MindFormers ``swap_config`` -> :class:`SwapConfig` (None when ``swap`` is false).

    ``layer_swap: [{layers: true | [ids], backward_prefetch: n}, ...]`` -> whole layers;
    ``op_swap: [{op_name: pattern, layers: ..., backward_prefetch: n}, ...]`` (or MindFormers'
    normalized ``{pattern: [{layers, backward_prefetch}]}``) -> select patterns; neither -> the
    attention core in every layer (MindFormers' default: flash_attention)."""
    cfg = dict(swap_config or {})
    unknown = sorted(set(cfg) - set(MF_SWAP_KEYS))
    if unknown:
        raise PatternError(f"swap_config: unknown key(s) {unknown}; known keys are {list(MF_SWAP_KEYS)}")
    if not cfg.get("swap", False):
        return None
    notes: List[str] = []
    prefetch = {"default": cfg.get("default_prefetch", 1)}
    whole: LayerSel = False
    for i, item in enumerate(cfg.get("layer_swap") or []):
        if not isinstance(item, Mapping) or "layers" not in item:
            raise PatternError(f"swap_config.layer_swap[{i}]={item!r}: expected {{layers: true | [ids], "
                               "backward_prefetch: n}")
        whole = _union(whole, mf_layers(item["layers"], None, f"swap_config.layer_swap[{i}].layers", True))
        prefetch[f"layer_swap[{i}]"] = item.get("backward_prefetch", cfg.get("default_prefetch", 1))
    ops_cfg = cfg.get("op_swap") or []
    entries = []
    if isinstance(ops_cfg, Mapping):
        for name, rules in ops_cfg.items():
            for rule in (rules if isinstance(rules, (list, tuple)) else [rules]):
                entries.append((name, rule))
    else:
        for i, item in enumerate(ops_cfg):
            if not isinstance(item, Mapping) or "op_name" not in item:
                raise PatternError(f"swap_config.op_swap[{i}]={item!r}: expected {{op_name: pattern, layers: "
                                   "true | [ids], backward_prefetch: n}")
            entries.append((item["op_name"], item))
    select: Dict[str, LayerSel] = {}
    for name, rule in entries:
        if not isinstance(name, str) or not isinstance(rule, Mapping):
            raise PatternError(f"swap_config.op_swap: entry {name!r}: {rule!r} is not an op_name with "
                               "{layers, backward_prefetch}")
        new, note = translate_mindformers(name)
        if note:
            notes.append(f"swap_config.op_swap: {note}")
        sel = mf_layers(rule.get("layers", True), None, f"swap_config.op_swap[{name!r}].layers", True)
        key = layer_relative(new)
        select[key] = _union(select[key], sel) if key in select else sel
        prefetch[f"op_swap[{name!r}]"] = rule.get("backward_prefetch", cfg.get("default_prefetch", 1))
    if not select and (whole is False or whole == []):
        select = {layer_relative(r"self_attention\.core_attention"): "all"}
        notes.append("swap_config: swap without layer_swap/op_swap swaps every layer's attention core "
                     "(MindFormers' default: flash_attention)")
    return SwapConfig(select=select, layers=whole, prefetch=prefetch, notes=notes)
