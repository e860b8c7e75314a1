"""LoRA on the parallel linears: ``y = base(x) + (dropout(x) @ A @ B) * alpha / r``, base frozen.

``LoRALinear`` keeps the base Cell (its parameters keep their names and the base keeps its ``shard()``)
and adds two atomic ``linear`` Cells, ``lora_a`` (in, r) and ``lora_b`` (r, out), whose layouts follow the
base's split (no communication code here: the sharding pass inserts it):

* column-parallel base (weight split over the output, ``("None", "tp")``): A replicated, B split like the
  base's output ``("None", "tp")``: every rank computes its columns of the delta, nothing extra is sent;
* row-parallel base (weight split over the input, ``("tp", "None")``): A split like the base's input
  ``("tp", "None")`` and its (b, s, r) output reduced over tp (r numbers per token, instead of the hidden
  size) into the base's output layout (sequence parallel: reduce-scattered over the sequence), B replicated.

Routed experts (``LoRAExperts``, one ``moe_experts`` op): each adapted expert weight ``W`` (E, in, out) gets
``A`` (E, in, r) and ``B`` (E, r, out), split over the expert dim like ``W`` (ep), and the experts compute with
``W + A @ B * alpha / r`` per expert (as PEFT's LoRA on expert parameters does: the delta folded into the
weight, so ``lora_dropout`` cannot apply there and is refused for experts).

B starts at zero, so step 0 is the base model. ``apply_lora`` wraps the Cells whose names match the
settings' ``target_modules`` (ours, Hugging Face's or MindFormers' names), before the model is
parallelized, and freezes every other parameter (``requires_grad = False``: not in ``trainable_params()``,
so no gradient, no optimizer state, not in the adapter checkpoint).
"""
from __future__ import annotations

import math
import re
from typing import List, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..transformer.linear import ColumnParallelLinear, RowParallelLinear, _Linear, sequence_parallel_layout
from ..transformer.init import normal_array
from ..transformer.moe import RoutedExperts
from .config import LoraConfigError, LoraSettings, matches

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")

FROZEN_ATTR = "lora_frozen"        # set on every frozen base Parameter
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class _AdapterLinear(_Linear):
    """One LoRA factor: an atomic ``linear`` with layouts given by the LoRALinear that owns it."""

    def __init__(self, input_size, output_size, config, key: str, std: float, split: str):
        super().__init__(input_size, output_size, config, bias=False, init_std=std)
        self.weight.set_data(Tensor(normal_array(key, (input_size, output_size), std) if std > 0 else
                                    np.zeros((input_size, output_size), np.float32), self.weight.dtype))
        self.split = split            # "a_col", "b_col", "a_row", "b_row"

    def shard(self, config):
        L = config.layout
        if self.split == "a_col":
            return None, None, {"weight": L("None", "None")}
        if self.split == "b_col":
            return None, None, {"weight": L("None", "tp")}
        if self.split == "a_row":     # the partial (b, s, r) product reduced over tp at the output, into the
            # layout of the base's output (sequence parallel: reduce-scattered over the sequence, so that B's
            # delta arrives split like the base's output it is added to)
            return L("dp", "cp", "tp"), sequence_parallel_layout(config), {"weight": L("tp", "None")}
        return None, None, {"weight": L("None", "None")}


class LoRALinear(nn.Cell):
    """A column- or row-parallel linear plus its low-rank update."""

    def __init__(self, base: _Linear, settings: LoraSettings, config, name: str):
        """``name``: the linear's global name (A's random values are keyed by it, so a pipeline stage draws
        the same A as one process)."""
        super().__init__()
        kind = "col" if isinstance(base, ColumnParallelLinear) else "row"
        self.base = base
        self.rank, self.scaling = settings.rank, settings.scaling
        self.lora_a = _AdapterLinear(base.input_size, settings.rank, config, f"{name}.lora_a.weight",
                                     1.0 / math.sqrt(base.input_size), f"a_{kind}")
        self.lora_b = _AdapterLinear(settings.rank, base.output_size, config, f"{name}.lora_b.weight", 0.0,
                                     f"b_{kind}")
        self.dropout_p = settings.dropout
        self.use_dropout = settings.dropout > 0
        self.input_size, self.output_size = base.input_size, base.output_size

    def construct(self, x):
        out = self.base(x)
        h = x
        if self.use_dropout:
            h = ops.dropout(h, p=self.dropout_p, training=self.training)
        delta = self.lora_b(self.lora_a(h))
        return out + delta * self.scaling

    def extend_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling}"


class LoRAExperts(RoutedExperts):
    """Routed experts (the base's frozen weights) plus low-rank updates of the adapted ones (``adapted``: a
    subset of w_gate / w_up / w_down); ``expert_weights`` returns ``W + A @ B * scaling`` per expert, which
    the one-card path and the expert-parallel kernel both compute with."""

    def __init__(self, base: RoutedExperts, settings: LoraSettings, name: str, adapted: Tuple[str, ...]):
        """``name``: the experts' global Cell name (A's random values are keyed by it)."""
        nn.Cell.__init__(self)
        for attr in ("num_experts", "hidden", "ffn", "capacity_factor", "init_std", "compute_dtype"):
            setattr(self, attr, getattr(base, attr))
        self.w_gate, self.w_up, self.w_down = base.w_gate, base.w_up, base.w_down
        self.rank, self.scaling = settings.rank, settings.scaling
        self.adapted = tuple(adapted)
        r = settings.rank
        for w in EXPERT_WEIGHTS:
            a = b = None
            if w in adapted:
                weight = getattr(base, w)
                E, fan_in, fan_out = weight.shape
                a = Parameter(Tensor(normal_array(f"{name}.{w}.lora_a.weight", (E, fan_in, r), 1.0 / math.sqrt(fan_in)),
                                     weight.dtype), name=f"{w}_lora_a")
                b = Parameter(Tensor(np.zeros((E, r, fan_out), np.float32), weight.dtype), name=f"{w}_lora_b")
            setattr(self, f"{w}_lora_a", a)
            setattr(self, f"{w}_lora_b", b)
        self.sharding_params = EXPERT_WEIGHTS + tuple(f"{w}_lora_{x}" for w in self.adapted for x in "ab")

    def expert_weights(self, dtype):
        g, u, d = self.w_gate.astype(dtype), self.w_up.astype(dtype), self.w_down.astype(dtype)
        if self.w_gate_lora_a is not None:
            g = g + ops.bmm(self.w_gate_lora_a.astype(dtype), self.w_gate_lora_b.astype(dtype)) * self.scaling
        if self.w_up_lora_a is not None:
            u = u + ops.bmm(self.w_up_lora_a.astype(dtype), self.w_up_lora_b.astype(dtype)) * self.scaling
        if self.w_down_lora_a is not None:
            d = d + ops.bmm(self.w_down_lora_a.astype(dtype), self.w_down_lora_b.astype(dtype)) * self.scaling
        return g, u, d

    def adapter_params(self) -> List[Parameter]:
        return [getattr(self, f"{w}_lora_{x}") for w in self.adapted for x in "ab"]

    def extend_repr(self) -> str:
        return f"adapted={list(self.adapted)}, rank={self.rank}, scaling={self.scaling}"


def _experts(model: nn.Cell) -> List[Tuple[str, nn.Cell, str, RoutedExperts]]:
    """(path, parent, attribute, experts) of every routed-experts Cell inside a decoder layer."""
    out = []
    for path, cell in model.cells_and_names():
        for attr, child in cell.name_cells().items():
            if type(child) is RoutedExperts:
                full = f"{path}.{attr}" if path else attr
                if full.startswith("decoder.layers.") or ".decoder.layers." in full:
                    out.append((full, cell, attr, child))
    return out


def _targets(model: nn.Cell) -> List[Tuple[str, nn.Cell, str, _Linear]]:
    """(path, parent, attribute, linear) of every column/row-parallel linear inside a decoder layer."""
    out = []
    for path, cell in model.cells_and_names():
        for attr, child in cell.name_cells().items():
            if isinstance(child, (ColumnParallelLinear, RowParallelLinear)) and not isinstance(child, _AdapterLinear):
                full = f"{path}.{attr}" if path else attr
                if full.startswith("decoder.layers.") or ".decoder.layers." in full:
                    out.append((full, cell, attr, child))
    return out


def matched_names(model: nn.Cell, settings: LoraSettings) -> List[str]:
    """What :func:`apply_lora` would adapt in ``model`` (global layer numbers), without changing it."""
    names = [_global_name(model, path) for path, *_ in _targets(model) if matches(settings, _global_name(model, path))]
    for path, *_ in _experts(model):
        names += [f"{_global_name(model, path)}.{w}" for w in EXPERT_WEIGHTS
                  if matches(settings, f"{_global_name(model, path)}.{w}")]
    return names


def no_match_error(settings: LoraSettings, model: nn.Cell) -> LoraConfigError:
    known = [_global_name(model, p) for p, *_ in _targets(model)][:8]
    return LoraConfigError(f"{settings.source}.target_modules = {list(settings.target_modules)!r}: matches no "
                           f"layer of this model; its linears are named like {known} (Hugging Face: "
                           "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; MindFormers: wq, wk, "
                           "wv, wo, w1, w2, w3; routed experts: <layer>.mlp.experts.w_gate / w_up / w_down, "
                           "Hugging Face's mlp.experts.gate_proj / up_proj / down_proj or gate_up_proj)")


def apply_lora(model: nn.Cell, settings: LoraSettings, config, require_match: bool = True) -> List[str]:
    """Wrap the matching linears of an unparallelized ``model`` in place; freeze every other parameter.
    Returns the adapted names (linears; experts' weights as ``<experts>.w_gate``). Names are matched with
    their global layer numbers (a pipeline stage's decoder knows them). A ``target_modules`` that matches
    nothing is a ``LoraConfigError`` unless ``require_match`` is False (a pipeline stage may hold none of
    the adapted layers: the caller checks the whole model)."""
    wrapped, adapters = [], []
    for path, parent, attr, linear in _targets(model):
        if not matches(settings, _global_name(model, path)):
            continue
        names = {k: p.name for k, p in (("weight", linear.weight), ("bias", linear.bias)) if p is not None}
        lora = LoRALinear(linear, settings, config, _global_name(model, path))
        setattr(parent, attr, lora)
        for k, n in names.items():                   # the base keeps its names (checkpoints, HF tables)
            getattr(linear, k).name = n
        lora.lora_a.weight.name = f"{path}.lora_a.weight"
        lora.lora_b.weight.name = f"{path}.lora_b.weight"
        wrapped.append(path)
        adapters += [lora.lora_a.weight, lora.lora_b.weight]
    for path, parent, attr, experts in _experts(model):
        adapted = tuple(w for w in EXPERT_WEIGHTS if matches(settings, f"{_global_name(model, path)}.{w}"))
        if not adapted:
            continue
        if settings.dropout > 0:
            raise LoraConfigError(f"{settings.source}.lora_dropout = {settings.dropout}: LoRA on the routed experts "
                                  f"({path}.{adapted[0]}) folds A @ B into the expert weights (as PEFT does for "
                                  "expert parameters), where no dropout of the input can apply; set lora_dropout: 0 "
                                  "or leave the experts out of target_modules")
        names = {w: getattr(experts, w).name for w in EXPERT_WEIGHTS}
        lora = LoRAExperts(experts, settings, _global_name(model, path), adapted)
        setattr(parent, attr, lora)
        for w, n in names.items():                   # the base keeps its names (checkpoints, HF tables)
            getattr(lora, w).name = n
        for w in adapted:
            getattr(lora, f"{w}_lora_a").name = f"{path}.{w}.lora_a.weight"
            getattr(lora, f"{w}_lora_b").name = f"{path}.{w}.lora_b.weight"
        adapters += lora.adapter_params()
        wrapped += [f"{path}.{w}" for w in adapted]
    if not wrapped and require_match:
        raise no_match_error(settings, model)
    adapters = {id(p) for p in adapters}
    for p in model.get_parameters():
        if id(p) not in adapters and p.requires_grad:
            p.requires_grad = False
            setattr(p, FROZEN_ATTR, True)
    return wrapped


def _global_name(model: nn.Cell, path: str) -> str:
    """``path`` with its layer number made global (a pipeline stage numbers its layers from 0; its decoder
    knows their global ``layer_numbers``, 1-based)."""
    numbers = getattr(getattr(model, "decoder", None), "layer_numbers", None)
    m = _LAYER.match(path)
    if numbers is None or m is None:
        return path
    return f"decoder.layers.{numbers[int(m.group(1))] - 1}.{m.group(2)}"


def frozen_params(chunks) -> List[Parameter]:
    """The frozen base parameters of LoRA-wrapped model chunks (empty without LoRA)."""
    return [p for chunk in chunks for p in chunk.get_parameters() if getattr(p, FROZEN_ATTR, False)]


def is_adapter(name: str) -> bool:
    return name.endswith((".lora_a.weight", ".lora_b.weight"))
