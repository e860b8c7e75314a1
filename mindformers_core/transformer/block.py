"""The stack of transformer layers, or the part of it one pipeline stage holds.

The stage's layers come from :func:`mindformers_core.common.placement.layers_of_stage`
(the same split every pipeline component uses); each layer is built from the LayerSpec that
``layer_spec`` gives for its *global* number (a spec, or a spec function ``(config, layer_number) ->
LayerSpec``), so a stage builds exactly its own layers and gets the same weights they have in the full
model. The final norm lives on the last stage only.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn

from ..common.placement import layers_of_stage
from .config import TransformerConfig
from .layer import TransformerLayer, gpt_layer_spec
from .norm import build_norm
from .spec import LayerSpecLike, spec_for_layer


def stage_of(config: TransformerConfig, pp_rank: int = 0, vp_stage: Optional[int] = None,
             layers_per_stage: Optional[Sequence] = None):
    """The :class:`StageLayers` of pipeline rank ``pp_rank``'s virtual stage ``vp_stage``."""
    return layers_of_stage(config.num_layers, config.pipeline_model_parallel_size, pp_rank,
                           config.virtual_pipeline_model_parallel_size, vp_stage, layers_per_stage)


class TransformerBlock(nn.Cell):
    """(b, s, h) -> (b, s, h) through this stage's layers (all of them when pp == 1)."""

    def __init__(self, config: TransformerConfig, layer_spec: LayerSpecLike = gpt_layer_spec, pp_rank: int = 0,
                 vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None,
                 post_layer_norm: Optional[bool] = None):
        super().__init__()
        stage = stage_of(config, pp_rank, vp_stage, layers_per_stage)
        self.stage = stage
        self.layer_numbers = [i + 1 for i in stage.layers]
        self.layers = nn.CellList([TransformerLayer(config, n, spec_for_layer(layer_spec, config, n))
                                   for n in self.layer_numbers])
        self.has_final_layernorm = stage.has_output if post_layer_norm is None else post_layer_norm
        self.final_layernorm = build_norm(config.hidden_size, config) if self.has_final_layernorm else None
        # MoE layers with a load-balancing loss return (x, aux); the block then returns (x, sum of aux)
        self.aux_flags = tuple(bool(getattr(layer, "returns_aux", False)) for layer in self.layers)
        self.returns_aux = any(self.aux_flags)
        self.num_local_layers = len(self.layer_numbers)

    def construct(self, x, position_ids=None, segment_ids=None, cache_slots=None, kv_mask=None):
        if self.returns_aux:
            return self._construct_with_aux(x, position_ids, segment_ids, cache_slots, kv_mask)
        for layer in self.layers:
            if cache_slots is None:
                x = layer(x, position_ids, segment_ids)
            else:
                x = layer(x, position_ids, segment_ids, cache_slots, kv_mask)
        if self.has_final_layernorm:
            x = self.final_layernorm(x)
        return x

    def _construct_with_aux(self, x, position_ids, segment_ids, cache_slots=None, kv_mask=None):
        aux = ()
        for i in range(self.num_local_layers):
            if self.aux_flags[i]:
                if cache_slots is None:
                    x, a = self.layers[i](x, position_ids, segment_ids)
                else:
                    x, a = self.layers[i](x, position_ids, segment_ids, cache_slots, kv_mask)
                aux = aux + (a,)
            elif cache_slots is None:
                x = self.layers[i](x, position_ids, segment_ids)
            else:
                x = self.layers[i](x, position_ids, segment_ids, cache_slots, kv_mask)
        if self.has_final_layernorm:
            x = self.final_layernorm(x)
        total = aux[0]
        for a in aux[1:]:
            total = total + a
        return x, total
