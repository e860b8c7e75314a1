"""The Llama family: config mapping (``config.py``), model and layer spec (``model.py``), Hugging Face
name table (``hf.py``), registered here as ``model.arch.type: LlamaForCausalLM`` (``model_type``
llama). Its YAMLs and the converter command stay in ``research/llama/``."""
from ..registry import register_model
from .config import LlamaConfig, llama_ffn_hidden_size
from .hf import LLAMA_HF, LLAMA_HF_CONFIG
from .model import LlamaForCausalLM, llama_layer_spec

register_model("LlamaForCausalLM", config_class=LlamaConfig, model_type="llama", tokenizer="llama",
               layer_spec=llama_layer_spec, state_dict_adapter=LLAMA_HF, hf_config=LLAMA_HF_CONFIG)(LlamaForCausalLM)

__all__ = ["LlamaConfig", "LlamaForCausalLM", "llama_ffn_hidden_size", "llama_layer_spec", "LLAMA_HF", "LLAMA_HF_CONFIG"]
