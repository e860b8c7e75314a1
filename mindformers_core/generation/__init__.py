"""Generation: a static KV cache (``transformer/kv_cache.py``), the prefill/decode loop over batched prompts
(``generate``), Hugging Face's sampling (``sampling``) and generation keys (``config``)."""
from .cache import attach_kv_cache, detach_kv_cache
from .config import GenerationConfig
from .generate import CachedStep, GenerationResult, GenerationStats, Generator, left_pad
from .sampling import TokenChooser

__all__ = ["GenerationConfig", "Generator", "GenerationResult", "GenerationStats", "CachedStep", "TokenChooser",
           "attach_kv_cache", "detach_kv_cache", "left_pad"]
