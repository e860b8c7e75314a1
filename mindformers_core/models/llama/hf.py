"""Llama's Hugging Face names (``LlamaForCausalLM``, and Qwen2's q/k/v biases and Qwen3's q/k norms,
which only models that have them hold): the table and its state-dict adapter.

Hugging Face's ``nn.Linear`` stores ``(out, in)``; ours stores ``(in, out)`` (``x @ W``), so every
projection and the LM head are transposed. Both use the rotate-half RoPE convention, so q/k need no
permutation. Layers are named by their global index (``decoder.layers.{i}`` <-> ``model.layers.{i}``).
"""
from __future__ import annotations

from ..hf.config import HFConfigMapping
from ..state_dict import NameRule, StateDictAdapter, layer_rules

# our name inside a layer -> (Hugging Face name inside a layer, transposed?)
LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight", False),
    "self_attention.linear_q.weight": ("self_attn.q_proj.weight", True),
    "self_attention.linear_k.weight": ("self_attn.k_proj.weight", True),
    "self_attention.linear_v.weight": ("self_attn.v_proj.weight", True),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", True),
    "self_attention.linear_q.bias": ("self_attn.q_proj.bias", False),
    "self_attention.linear_k.bias": ("self_attn.k_proj.bias", False),
    "self_attention.linear_v.bias": ("self_attn.v_proj.bias", False),
    "self_attention.linear_proj.bias": ("self_attn.o_proj.bias", False),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight", False),    # Qwen3
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight", False),    # Qwen3
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", False),
    "mlp.linear_fc1_gate.weight": ("mlp.gate_proj.weight", True),
    "mlp.linear_fc1_up.weight": ("mlp.up_proj.weight", True),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight", True),
}
TOP_MAP = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight", False),
    "decoder.final_layernorm.weight": ("model.norm.weight", False),
    "output_layer.weight": ("lm_head.weight", True),
}

LLAMA_HF = StateDictAdapter(
    [NameRule(ours, hf, t) for ours, (hf, t) in TOP_MAP.items()]
    + layer_rules("decoder.layers.{i}.", "model.layers.{i}.", LAYER_MAP),
    fallbacks={"lm_head.weight": "model.embed_tokens.weight"},      # a tied Hugging Face checkpoint
    ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq",))

# config.json: LlamaForCausalLM (MindFormers' LlamaConfig default seq_length 2048 when the YAML gives none)
LLAMA_HF_CONFIG = HFConfigMapping(("LlamaForCausalLM",), "llama", defaults={"seq_length": 2048})
