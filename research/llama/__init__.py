"""Llama written with mindformers_core.transformer (model code only)."""
