"""Layer specs: what a transformer layer is made of, as data.

A :class:`LayerSpec` names a layer's parts -- its two norms, its attention (with the attention's own
parts in an :class:`AttentionSpec`) and its MLP, which may be a mixture of experts. ``TransformerLayer``
builds exactly those parts; a model family says what its model is with one *spec function*
``(config, layer_number) -> LayerSpec`` (Megatron-core's ``TransformerLayerSubmodules`` /
``gpt_layer_specs`` have this shape). Choices that differ per layer -- dense first-k layers of a MoE
model, for instance -- are made in the spec function, visibly, never by swapping a class behind the
model's back.

Every part is a class built as ``cls(config)`` (MLPs), ``cls(config, layer_number, spec)`` (attention),
``cls(size, config)`` (norms); ``None`` for a norm means the one ``config.normalization`` names.
This module holds no layers of its own and imports none: the defaults are filled in by the layers.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Union

from mindspore import nn


@dataclass(frozen=True)
class AttentionSpec:
    """The attention block's parts. ``module``: the attention Cell (None: ``SelfAttention``);
    ``q_norm`` / ``k_norm``: a per-head norm of the queries / keys before the rotary embedding
    (Qwen3's ``HeadNorm``), None for none; ``core``: the softmax(qk)v Cell (None:
    ``DotProductAttention``); ``options``: extra keyword arguments of ``module``."""
    module: Optional[type] = None
    q_norm: Optional[type] = None
    k_norm: Optional[type] = None
    core: Optional[type] = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerSpec:
    """A transformer layer's parts, in the order they run: ``input_norm`` -> ``attention`` ->
    residual -> ``pre_mlp_norm`` -> ``mlp`` -> residual. ``mlp``: a Cell class built as
    ``mlp(config)`` (None: the dense ``MLP``; ``MoELayer`` for a mixture of experts). An MLP whose
    instance has ``returns_aux`` set returns ``(y, load-balancing loss)``; the layer passes the loss on."""
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    mlp: Optional[type] = None
    input_norm: Optional[type] = None
    pre_mlp_norm: Optional[type] = None

    def with_mlp(self, mlp: Optional[type]) -> "LayerSpec":
        return replace(self, mlp=mlp)


SpecFunction = Callable[[Any, int], LayerSpec]
LayerSpecLike = Union[LayerSpec, SpecFunction]


def spec_for_layer(spec: LayerSpecLike, config, layer_number: int) -> LayerSpec:
    """The LayerSpec of global layer ``layer_number``: ``spec`` itself, or what the spec function
    returns for that layer. A clear ``TypeError`` for anything else (a Cell class is not a spec)."""
    if isinstance(spec, LayerSpec):
        return spec
    if isinstance(spec, type) and issubclass(spec, nn.Cell):
        raise TypeError(f"layer_spec={spec.__name__} is a Cell class; give a LayerSpec or a spec function "
                        "(config, layer_number) -> LayerSpec (mindformers_core.transformer.spec)")
    if callable(spec):
        out = spec(config, layer_number)
        if not isinstance(out, LayerSpec):
            raise TypeError(f"the spec function {getattr(spec, '__name__', spec)!r} returned {out!r} for layer "
                            f"{layer_number}; it must return a LayerSpec")
        return out
    raise TypeError(f"layer_spec={spec!r}: give a LayerSpec or a spec function (config, layer_number) -> LayerSpec")
