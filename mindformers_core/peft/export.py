"""LoRA adapters out of a run: merged into the base weights (ours: ``W + A @ B * alpha / r``), or written as a
PEFT adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``) that ``peft`` loads onto the
Hugging Face base model. ``hf_name_of`` maps our parameter name to its Hugging Face name (the model family's
table); Hugging Face stores ``(out, in)``, ours ``(in, out)``, so ``lora_A = A.T`` (r, in) and
``lora_B = B.T`` (out, r)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Callable, Dict, Mapping

import numpy as np

from .config import LoraSettings

A, B = ".lora_a.weight", ".lora_b.weight"


def adapter_pairs(state: Mapping[str, np.ndarray]) -> Dict[str, tuple]:
    """``{base weight name: (A, B)}`` of the adapters in ``state``."""
    out = {}
    for name, a in state.items():
        if name.endswith(A):
            module = name[:-len(A)]
            out[f"{module}.weight"] = (np.asarray(a), np.asarray(state[module + B]))
    return out


def merge_lora(base: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray], scaling: float
               ) -> Dict[str, np.ndarray]:
    """The base state (our names, whole tensors) with every adapter's delta added; adapters dropped."""
    merged = {k: v for k, v in base.items() if not k.endswith((A, B))}
    for name, (a, b) in adapter_pairs(adapters).items():
        if name not in merged:
            raise KeyError(f"LoRA adapter for {name}: the base weights hold no such tensor")
        w = merged[name]
        delta = (a.astype(np.float64) @ b.astype(np.float64)) * scaling
        merged[name] = (w.astype(np.float64) + delta).astype(w.dtype)
    return merged


def write_peft_adapter(out: str, adapters: Mapping[str, np.ndarray], settings: LoraSettings,
                       hf_name_of: Callable[[str], str], base_model: str = "") -> str:
    """``out`` as a PEFT LoRA adapter folder (atomic: written beside, then renamed)."""
    from safetensors.numpy import save_file
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists; give a new folder")
    tensors, modules = {}, set()
    for name, (a, b) in adapter_pairs(adapters).items():
        hf = hf_name_of(name)
        if not hf.endswith(".weight"):
            raise KeyError(f"{name}: its Hugging Face name {hf!r} is not a module weight")
        module = hf[:-len(".weight")]
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b.T)
        modules.add(module.rsplit(".", 1)[-1])
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model or None,
              "r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout,
              "target_modules": sorted(modules), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
              "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".peft_", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
            json.dump(config, f, indent=2)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
