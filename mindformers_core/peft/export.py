"""LoRA adapters out of a run: merged into the base weights (ours: ``W + A @ B * alpha / r``), or written as a
PEFT adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``) that ``peft`` loads onto the
Hugging Face base model. ``hf_name_of`` maps our parameter name to its Hugging Face name (the model family's
table); Hugging Face stores ``(out, in)``, ours ``(in, out)``, so ``lora_A = A.T`` (r, in) and
``lora_B = B.T`` (out, r)."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Callable, Dict, Mapping

import numpy as np

from .config import LoraSettings

A, B = ".lora_a.weight", ".lora_b.weight"


class PeftFormatError(ValueError):
    """Adapters that the PEFT adapter format cannot hold as they are (the message says why)."""


def adapter_pairs(state: Mapping[str, np.ndarray]) -> Dict[str, tuple]:
    """``{base weight name: (A, B)}`` of the adapters in ``state``: a linear's ``<module>.lora_a.weight``
    adapts ``<module>.weight``; a routed experts' ``<experts>.w_gate.lora_a.weight`` (A (E, in, r), three
    dims) adapts ``<experts>.w_gate``."""
    out = {}
    for name, a in state.items():
        if name.endswith(A):
            module = name[:-len(A)]
            a = np.asarray(a)
            out[module if a.ndim == 3 else f"{module}.weight"] = (a, np.asarray(state[module + B]))
    return out


def merge_lora(base: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray], scaling: float
               ) -> Dict[str, np.ndarray]:
    """The base state (our names, whole tensors) with every adapter's delta added; adapters dropped."""
    merged = {k: v for k, v in base.items() if not k.endswith((A, B))}
    for name, (a, b) in adapter_pairs(adapters).items():
        if name not in merged:
            raise KeyError(f"LoRA adapter for {name}: the base weights hold no such tensor")
        w = merged[name]
        delta = np.matmul(a.astype(np.float64), b.astype(np.float64)) * scaling       # experts: per expert
        merged[name] = (w.astype(np.float64) + delta).astype(w.dtype)
    return merged


# transformers 5 holds a layer's routed experts as one module with two stacked parameters: gate_up_proj
# (E, 2f, h: the gate's f rows, then the up's) and down_proj (E, h, f); PEFT adapts them with
# ``target_parameters`` (its ParamWrapper: lora_A (r E, in), lora_B (out, r E), expert e's rank-r factors at
# rows e r .. e r + r of A and columns j E + e of B; the delta folded into the parameter)
_EXPERT_PART = re.compile(r"^(.*\.experts)\.0\.(gate|up|down)_proj\.weight$")


def _expert_factors(parts: Dict[str, tuple]) -> Dict[str, tuple]:
    """{"gate_up_proj" / "down_proj": (PEFT lora_A (R E, in), lora_B (out, R E), R)} of one experts module's
    adapters (ours: A (E, in, r), B (E, r, out) for "gate" / "up" / "down"). Gate and up share PEFT's one
    gate_up_proj adapter: their factors side by side (rank 2r when both are adapted, B block-diagonal) give
    exactly the sum of the two deltas."""
    out = {}
    for param, names in (("gate_up_proj", ("gate", "up")), ("down_proj", ("down",))):
        present = [n for n in names if n in parts]
        if not present:
            continue
        E, fan_in, r = parts[present[0]][0].shape
        width = parts[present[0]][1].shape[2]                     # f (gate / up) or h (down)
        R = r * len(present)
        a_peft = np.zeros((E, R, fan_in), np.float32)             # per expert (R, in)
        b_peft = np.zeros((E, width * len(names), R), np.float32)    # per expert (out, R)
        for j, n in enumerate(present):
            a, b = parts[n]
            row = names.index(n) * width
            a_peft[:, j * r:(j + 1) * r, :] = a.transpose(0, 2, 1)
            b_peft[:, row:row + width, j * r:(j + 1) * r] = b.transpose(0, 2, 1)
        out[param] = (a_peft.reshape(E * R, fan_in), b_peft.transpose(1, 2, 0).reshape(-1, R * E), R)
    return out


def write_peft_adapter(out: str, adapters: Mapping[str, np.ndarray], settings: LoraSettings,
                       hf_name_of: Callable[[str], str], base_model: str = "") -> str:
    """``out`` as a PEFT LoRA adapter folder (atomic: written beside, then renamed). ``hf_name_of`` gives a
    routed experts' weight the name of its expert 0 (``...experts.0.gate_proj.weight``)."""
    from safetensors.numpy import save_file
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists; give a new folder")
    tensors, modules, experts = {}, set(), {}
    for name, (a, b) in adapter_pairs(adapters).items():
        hf = hf_name_of(name)
        if a.ndim == 3:
            m = _EXPERT_PART.match(hf)
            if m is None:
                raise KeyError(f"{name}: its Hugging Face name {hf!r} is not a routed expert's gate/up/down_proj")
            experts.setdefault(m.group(1), {})[m.group(2)] = (a, b)
            continue
        if not hf.endswith(".weight"):
            raise KeyError(f"{name}: its Hugging Face name {hf!r} is not a module weight")
        module = hf[:-len(".weight")]
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b.T)
        modules.add(module.rsplit(".", 1)[-1])
    clash = sorted(modules & {"gate_proj", "up_proj", "down_proj"})
    if experts and clash:
        raise PeftFormatError(f"PEFT adapter: LoRA on both the routed experts and dense MLP linears named {clash} has "
                              "no PEFT form here: peft (0.21) maps every target_modules entry named gate_proj / up_proj "
                              "/ down_proj of a Qwen3-MoE / Qwen2-MoE model to the experts' fused parameters and drops "
                              "it from the dense layers (mlp_only_layers); the merged Hugging Face export holds them "
                              "all. Leave the dense MLPs out (e.g. target_modules: '.*q_proj|.*experts\\.gate_proj') "
                              "for a PEFT adapter")
    params, rank_pattern, alpha_pattern = set(), {}, {}
    for module, parts in sorted(experts.items()):
        factors = _expert_factors(parts)
        for param, (a, b, R) in factors.items():
            # PEFT wraps a module's targeted parameters in its parameter order, the first innermost (base_layer)
            inner = ".base_layer" if param == "gate_up_proj" and len(factors) == 2 else ""
            tensors[f"base_model.model.{module}{inner}.lora_A.weight"] = np.ascontiguousarray(a)
            tensors[f"base_model.model.{module}{inner}.lora_B.weight"] = np.ascontiguousarray(b)
            key = f"mlp.experts.{param}"
            params.add(key)
            if R != settings.rank:           # gate and up both adapted: rank 2r, alpha scaled to keep alpha / r
                rank_pattern[key], alpha_pattern[key] = R, settings.alpha * R / settings.rank
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model or None,
              "r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout,
              "target_modules": sorted(modules), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
              "layers_to_transform": None, "layers_pattern": None, "rank_pattern": rank_pattern,
              "alpha_pattern": alpha_pattern}
    if params:
        config["target_parameters"] = sorted(params)
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
