"""Built-in model families and the model registry (``model.arch.type`` -> model and config class).

Importing this package registers the built-in models (Llama). User models register with
``@register_model`` and are loaded with ``--register_path`` (``import_register_path``).
"""
from .registry import (ModelSpec, get_model_spec, import_register_path, register_model, registered_models,
                       resolve_model)
from .llama import LlamaConfig, LlamaForCausalLM, llama_ffn_hidden_size

__all__ = ["ModelSpec", "register_model", "get_model_spec", "registered_models", "resolve_model", "import_register_path",
           "LlamaConfig", "LlamaForCausalLM", "llama_ffn_hidden_size"]
