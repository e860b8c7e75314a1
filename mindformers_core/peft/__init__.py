"""Parameter-efficient fine-tuning: LoRA adapters that wrap the parallel linears and are sharded like them
(docs/finetune.md, "LoRA")."""
from .config import LoraConfigError, LoraSettings, parse_lora
from .lora import LoRALinear, apply_lora, frozen_params, is_adapter

__all__ = ["LoraConfigError", "LoraSettings", "parse_lora", "LoRALinear", "apply_lora", "frozen_params",
           "is_adapter"]
