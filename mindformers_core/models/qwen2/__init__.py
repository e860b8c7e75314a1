"""The Qwen2 / Qwen2.5 family (``Qwen2ForCausalLM``, ``model_type: qwen2``): Llama's model with biases on the
query/key/value projections (never on the output projection), RMSNorm eps 1e-6. One file: the config
(``Qwen2Config``: Llama's mapping with Qwen2's defaults), the model class, the Hugging Face name table
(Llama's rows; the q/k/v biases are rows of it) and ``config.json`` mapping, registered together.
Data is read with the folder's Hugging Face tokenizer (kind ``hf``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..hf.config import HFConfigMapping
from ..llama.config import LlamaConfig
from ..llama.hf import LLAMA_HF
from ..llama.model import LlamaForCausalLM, llama_layer_spec
from ..registry import register_model


@dataclass
class Qwen2Config(LlamaConfig):
    """LlamaConfig with Qwen2's q/k/v biases and RMSNorm eps 1e-6."""
    add_qkv_bias: bool = True
    layernorm_epsilon: float = 1e-6


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Llama's model built from a :class:`Qwen2Config` (``construct`` as LlamaForCausalLM)."""


# config.json has no attention_bias key: the q/k/v biases are always there (MindFormers' default seq_length 4096)
QWEN2_HF_CONFIG = HFConfigMapping(("Qwen2ForCausalLM",), "qwen2", attention_bias=None,
                                  defaults={"add_qkv_bias": True, "seq_length": 4096})
QWEN2_HF = LLAMA_HF

register_model("Qwen2ForCausalLM", config_class=Qwen2Config, model_type="qwen2", tokenizer="hf",
               layer_spec=llama_layer_spec, state_dict_adapter=QWEN2_HF, hf_config=QWEN2_HF_CONFIG)(Qwen2ForCausalLM)

__all__ = ["Qwen2Config", "Qwen2ForCausalLM", "QWEN2_HF", "QWEN2_HF_CONFIG"]
