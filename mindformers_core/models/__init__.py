"""Built-in model families and the model registry (``model.arch.type`` -> a family's ``ModelSpec``).

One package per family (``models/<family>/``: config mapping, model and layer spec, Hugging Face name
table); importing this package registers the built-in ones (Llama, Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3; each also reads
its Hugging Face ``config.json``: ``models.hf.config.read_hf_config``). User families register with
``@register_model`` and are loaded with ``--register_path`` (``import_register_path``).
"""
from .registry import (ModelSpec, get_model_spec, import_register_path, register_model, registered_models,
                       resolve_model, spec_of_model)
from .state_dict import NameRule, StackedRule, StateDictAdapter, layer_rules
from .llama import LlamaConfig, LlamaForCausalLM, llama_ffn_hidden_size, llama_layer_spec
from .qwen2 import Qwen2Config, Qwen2ForCausalLM
from .qwen3 import Qwen3Config, Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from .deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM

__all__ = ["ModelSpec", "register_model", "get_model_spec", "registered_models", "resolve_model", "spec_of_model",
           "import_register_path", "NameRule", "StackedRule", "StateDictAdapter", "layer_rules",
           "LlamaConfig", "LlamaForCausalLM", "llama_ffn_hidden_size", "llama_layer_spec",
           "Qwen2Config", "Qwen2ForCausalLM", "Qwen3Config", "Qwen3ForCausalLM", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
           "DeepseekV3Config", "DeepseekV3ForCausalLM"]
