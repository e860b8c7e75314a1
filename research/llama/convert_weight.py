"""Convert Llama weights between this model and a Hugging Face single-file safetensors checkpoint.

Hugging Face's ``nn.Linear`` stores ``(out, in)``; ours stores ``(in, out)`` (``x @ W``), so
every projection and the LM head are transposed. Both use the rotate-half RoPE convention, so
q/k need no permutation. Layers are named by their global ``layer_number``, so a pipeline stage
model exports/imports exactly its own layers.

    python research/llama/convert_weight.py --config research/llama/llama_tiny.yaml \
        --direction hf2ms --input model.safetensors --output llama_ms.safetensors
    python research/llama/convert_weight.py --config research/llama/llama_tiny.yaml \
        --direction ms2hf --input llama_ms.safetensors --output model.safetensors

Files are written with the ``safetensors`` package when installed (metadata ``format: pt``, which
``transformers`` requires); otherwise with ``mindspore.save_checkpoint(format="safetensors")``.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, Mapping

import numpy as np
import mindspore as ms
from mindspore import Tensor

# our name inside a layer -> (Hugging Face name inside a layer, transposed?)
LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight", False),
    "self_attention.linear_q.weight": ("self_attn.q_proj.weight", True),
    "self_attention.linear_k.weight": ("self_attn.k_proj.weight", True),
    "self_attention.linear_v.weight": ("self_attn.v_proj.weight", True),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", True),
    "self_attention.linear_q.bias": ("self_attn.q_proj.bias", False),
    "self_attention.linear_k.bias": ("self_attn.k_proj.bias", False),
    "self_attention.linear_v.bias": ("self_attn.v_proj.bias", False),
    "self_attention.linear_proj.bias": ("self_attn.o_proj.bias", False),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", False),
    "mlp.linear_fc1_gate.weight": ("mlp.gate_proj.weight", True),
    "mlp.linear_fc1_up.weight": ("mlp.up_proj.weight", True),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight", True),
}
TOP_MAP = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight", False),
    "decoder.final_layernorm.weight": ("model.norm.weight", False),
    "output_layer.weight": ("lm_head.weight", True),
}
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def _hf_name(model, name: str):
    """(Hugging Face name, transposed?) of one of ``model``'s parameter names."""
    if name in TOP_MAP:
        return TOP_MAP[name]
    match = _LAYER.fullmatch(name)
    if not match or match.group(2) not in LAYER_MAP:
        raise KeyError(f"convert_weight: no Hugging Face name for parameter {name!r}")
    layer = model.decoder.layers[int(match.group(1))].layer_number - 1
    hf, transposed = LAYER_MAP[match.group(2)]
    return f"model.layers.{layer}.{hf}", transposed


def _numpy(param) -> np.ndarray:
    if param.dtype == ms.bfloat16:
        param = param.astype(ms.float32)
    return param.asnumpy()


def ms_to_hf(model) -> Dict[str, np.ndarray]:
    """``model``'s weights under Hugging Face Llama names and shapes."""
    out = {}
    for name, param in model.parameters_and_names():
        hf, transposed = _hf_name(model, name)
        data = _numpy(param)
        out[hf] = np.ascontiguousarray(data.T if transposed else data)
    return out


def hf_to_ms(model, hf: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The Hugging Face weights ``model`` holds, under ``model``'s parameter names and shapes.
    Raises KeyError naming a missing weight and ValueError naming a shape mismatch."""
    out = {}
    for name, param in model.parameters_and_names():
        hf_name, transposed = _hf_name(model, name)
        if hf_name not in hf:
            if hf_name == "lm_head.weight" and "model.embed_tokens.weight" in hf:
                hf_name = "model.embed_tokens.weight"    # a tied Hugging Face checkpoint
            else:
                raise KeyError(f"convert_weight: {hf_name!r} (for {name!r}) is not in the checkpoint")
        data = np.asarray(hf[hf_name])
        data = data.T if transposed else data
        if tuple(data.shape) != tuple(param.shape):
            raise ValueError(f"convert_weight: {hf_name!r} has shape {tuple(data.shape)} after conversion but "
                             f"{name!r} needs {tuple(param.shape)}; does the config match the checkpoint?")
        out[name] = np.ascontiguousarray(data)
    return out


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str) -> None:
    """Write atomically (temporary file, then rename)."""
    tmp = path + ".tmp"
    try:
        from safetensors.numpy import save_file
    except ImportError:
        ms.save_checkpoint(dict(tensors), tmp, format="safetensors")
    else:
        save_file(dict(tensors), tmp, metadata={"format": "pt"})
    os.replace(tmp if os.path.exists(tmp) else tmp + ".safetensors", path)


def load_safetensors(path: str) -> Dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"convert_weight: no such file {path!r}")
    try:
        from safetensors.numpy import load_file
    except ImportError:
        return {k: v.asnumpy() for k, v in ms.load_checkpoint(path, format="safetensors").items()}
    return load_file(path)


def load_into(model, tensors: Mapping[str, np.ndarray]) -> None:
    """Set ``model``'s parameters from arrays keyed by its own parameter names."""
    missing = [n for n, _ in model.parameters_and_names() if n not in tensors]
    if missing:
        raise KeyError(f"convert_weight: the checkpoint lacks {missing[:3]} ({len(missing)} missing); "
                       "is it a checkpoint of this model?")
    for name, param in model.parameters_and_names():
        param.set_data(Tensor(tensors[name], param.dtype))


def save_hf(model, path: str) -> None:
    save_safetensors(ms_to_hf(model), path)


def load_hf(model, path: str) -> None:
    load_into(model, hf_to_ms(model, load_safetensors(path)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML with model.model_config (e.g. llama_tiny.yaml)")
    parser.add_argument("--direction", required=True, choices=("hf2ms", "ms2hf"))
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from mindformers_core.training import read_yaml
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    model_config = read_yaml(args.config)["model"]["model_config"]
    model = LlamaForCausalLM(LlamaConfig.from_model_config(model_config))
    if args.direction == "hf2ms":
        save_safetensors(hf_to_ms(model, load_safetensors(args.input)), args.output)
    else:
        load_into(model, load_safetensors(args.input))
        save_hf(model, args.output)
    print(f"convert_weight: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
