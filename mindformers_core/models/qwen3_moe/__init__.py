"""The Qwen3-MoE family (``Qwen3MoeForCausalLM``, ``model_type: qwen3_moe``, e.g. Qwen3-30B-A3B): Qwen3's
attention (q/k norm, decoupled head_dim) and, in the layers ``decoder_sparse_step`` / ``mlp_only_layers``
choose, a mixture of experts instead of the MLP: a router (softmax over all experts, top-k, renormalized
when ``norm_topk_prob``), routed SwiGLU experts of width ``moe_intermediate_size``, no shared experts, and
the load-balancing loss over the whole batch x ``router_aux_loss_coef`` (Hugging Face's
``load_balancing_loss_func``; MindFormers' ``gbs_aux_loss``). Layer i (0-based) is MoE when it is not in
``mlp_only_layers`` and (i + 1) % decoder_sparse_step == 0; the others keep a dense MLP of
``intermediate_size``.

One file: config (``Qwen3MoeConfig``), model class, Hugging Face name table (Llama's rows plus the router
``mlp.gate.weight`` (E, h), transposed into ours (h, E), and the experts ``mlp.experts.{e}.*_proj.weight``
stacked into our (E, ...) tensors) and ``config.json`` mapping, registered together."""
from __future__ import annotations

from dataclasses import dataclass

from ..hf.config import HFConfigMapping
from ..llama.hf import LAYER_MAP, TOP_MAP
from ..llama.model import LlamaForCausalLM, llama_layer_spec
from ..qwen3 import Qwen3Config
from ..registry import register_model
from ..state_dict import NameRule, StackedRule, StateDictAdapter, layer_rules


@dataclass
class Qwen3MoeConfig(Qwen3Config):
    """Qwen3Config with Qwen3-MoE's router defaults (Hugging Face's: no renormalization unless
    ``norm_topk_prob``, load-balancing loss over the batch with coefficient 0.001). Needs experts."""
    moe_router_norm_topk_prob: bool = False
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 0.001

    @classmethod
    def from_model_config(cls, model_config, parallel_config=None, pipeline_interleave: int = 1) -> "Qwen3MoeConfig":
        config = super().from_model_config(model_config, parallel_config, pipeline_interleave)
        if config.num_moe_experts is None:
            raise ValueError("Qwen3MoeConfig: num_experts=None: Qwen3MoeForCausalLM is a mixture-of-experts model; "
                             "give model_config.num_experts (config.json: num_experts / num_local_experts)")
        return config


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Llama's model built from a :class:`Qwen3MoeConfig` (MoE layers from ``llama_layer_spec`` /
    ``config.is_moe_layer``)."""


EXPERT_MAP = {   # ours inside a layer -> (Hugging Face inside a layer, per expert {e}, transposed?)
    "mlp.experts.w_gate": ("mlp.experts.{e}.gate_proj.weight", True),
    "mlp.experts.w_up": ("mlp.experts.{e}.up_proj.weight", True),
    "mlp.experts.w_down": ("mlp.experts.{e}.down_proj.weight", True),
}
QWEN3_MOE_HF = StateDictAdapter(
    [NameRule(ours, hf, t) for ours, (hf, t) in TOP_MAP.items()]
    + layer_rules("decoder.layers.{i}.", "model.layers.{i}.", LAYER_MAP)          # attention, norms, dense MLPs
    + [NameRule("decoder.layers.{i}.mlp.router.weight", "model.layers.{i}.mlp.gate.weight", True)]
    + [StackedRule("decoder.layers.{i}." + ours, "model.layers.{i}." + hf, t) for ours, (hf, t) in EXPERT_MAP.items()],
    fallbacks={"lm_head.weight": "model.embed_tokens.weight"},
    ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq",))

QWEN3_MOE_HF_CONFIG = HFConfigMapping(("Qwen3MoeForCausalLM",), "qwen3_moe", moe=True,
                                      defaults={"qk_layernorm": True, "seq_length": 4096, "norm_topk_prob": False,
                                                "moe_router_load_balancing_type": "aux_loss",
                                                "moe_aux_loss_coeff": 0.001})

register_model("Qwen3MoeForCausalLM", config_class=Qwen3MoeConfig, model_type="qwen3_moe", tokenizer="hf",
               layer_spec=llama_layer_spec, state_dict_adapter=QWEN3_MOE_HF,
               hf_config=QWEN3_MOE_HF_CONFIG)(Qwen3MoeForCausalLM)

__all__ = ["Qwen3MoeConfig", "Qwen3MoeForCausalLM", "QWEN3_MOE_HF", "QWEN3_MOE_HF_CONFIG", "EXPERT_MAP"]
