"""A user model loaded with ``--register_path research/gpt_ln`` (see README.md)."""
from .gpt_ln import GPTLNConfig, GPTLNForCausalLM

__all__ = ["GPTLNConfig", "GPTLNForCausalLM"]
