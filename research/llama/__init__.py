"""Llama's YAMLs and Hugging Face weight converter; the model is mindformers_core.models.llama."""
