"""GPT with LayerNorm, a GELU MLP, biased linears and RoPE: a user model outside the package.

Model code only, as for the built-in models: ``GPTLNForCausalLM`` is a ``GPTModel`` with these
choices, and ``GPTLNConfig`` reads the same MindFormers ``model.model_config`` keys as
``LlamaConfig`` (``rms_norm_eps`` is the LayerNorm epsilon here; ``hidden_act`` gelu, the default,
or silu for a gated MLP). ``@register_model`` makes it ``model.arch.type: GPTLNForCausalLM`` once
this directory is imported with ``--register_path research/gpt_ln``. Parallelism is applied from
outside by the sharding pass, from the parallel sizes in the config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from mindformers_core.models import LlamaConfig, register_model
from mindformers_core.transformer import GPTModel, gpt_layer_spec


@dataclass
class GPTLNConfig(LlamaConfig):
    """LlamaConfig (keys, offset) with GPT's choices: LayerNorm, GELU, biases, MLP width 4h."""
    normalization: str = "LayerNorm"
    activation: str = "gelu"
    add_bias_linear: bool = True

    def __post_init__(self):
        if self.ffn_hidden_size is None and isinstance(self.hidden_size, int):
            self.ffn_hidden_size = 4 * self.hidden_size
        super().__post_init__()

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any], parallel_config: Optional[Mapping[str, Any]] = None,
                          pipeline_interleave: int = 1) -> "GPTLNConfig":
        """From a MindFormers ``model.model_config`` mapping; ``hidden_act`` absent means gelu."""
        model_config = dict(model_config)
        model_config.setdefault("hidden_act", "gelu")
        return super().from_model_config(model_config, parallel_config, pipeline_interleave)


@register_model("GPTLNForCausalLM", config_class=GPTLNConfig)
class GPTLNForCausalLM(GPTModel):
    """``construct(input_ids, labels=None)`` -> loss (labels given) or logits (b, s, vocab)."""

    def __init__(self, config: GPTLNConfig, pre_process: Optional[bool] = None, post_process: Optional[bool] = None,
                 pp_rank: int = 0, vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None):
        if layers_per_stage is None and isinstance(config, LlamaConfig):
            layers_per_stage = config.layers_per_stage()   # MindFormers' offset
        super().__init__(config, pre_process, post_process, gpt_layer_spec, pp_rank, vp_stage, layers_per_stage)
