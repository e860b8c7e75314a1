"""The Qwen3 family (``Qwen3ForCausalLM``, ``model_type: qwen3``): Llama's model with a per-head RMSNorm of
the queries and keys before the rotary embedding (``q_norm`` / ``k_norm``) and a head size that need not be
hidden_size / heads (``head_dim`` 128 with hidden 5120 and 64 heads in Qwen3-32B: q projects h -> heads x
head_dim, the output projection heads x head_dim -> h). One file: config (``Qwen3Config``), model class, the
Hugging Face name table (Llama's rows incl. the q/k norms) and ``config.json`` mapping, registered together.
Data is read with the folder's Hugging Face tokenizer (kind ``hf``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..hf.config import HFConfigMapping
from ..llama.config import LlamaConfig
from ..llama.hf import LLAMA_HF
from ..llama.model import LlamaForCausalLM, llama_layer_spec
from ..registry import register_model


@dataclass
class Qwen3Config(LlamaConfig):
    """LlamaConfig with Qwen3's q/k norm and RMSNorm eps 1e-6 (``kv_channels`` = config.json's head_dim)."""
    qk_layernorm: bool = True
    layernorm_epsilon: float = 1e-6


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Llama's model built from a :class:`Qwen3Config` (``construct`` as LlamaForCausalLM)."""


QWEN3_HF_CONFIG = HFConfigMapping(("Qwen3ForCausalLM",), "qwen3",
                                  defaults={"qk_layernorm": True, "seq_length": 4096})
QWEN3_HF = LLAMA_HF

register_model("Qwen3ForCausalLM", config_class=Qwen3Config, model_type="qwen3", tokenizer="hf",
               layer_spec=llama_layer_spec, state_dict_adapter=QWEN3_HF, hf_config=QWEN3_HF_CONFIG)(Qwen3ForCausalLM)

__all__ = ["Qwen3Config", "Qwen3ForCausalLM", "QWEN3_HF", "QWEN3_HF_CONFIG"]
