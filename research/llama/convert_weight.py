"""Convert weights between this model and a Hugging Face single-file safetensors checkpoint, for any
registered family with a state-dict adapter (``ModelSpec.state_dict_adapter``: the family's table of
Hugging Face names <-> ours, e.g. ``mindformers_core/models/llama/hf.py``). This file is only the
command: the names, transposes and layer patterns are the family's.

The model is built from ``--config`` (``model.arch.type`` and ``model.model_config``; a user family is
loaded with ``--register_path DIR`` as for training) so that names and shapes are checked. Layers are
named by their global ``layer_number``, so a pipeline stage model exports/imports exactly its own
layers. ``ms2hf`` reads one safetensors file of our names or a trainer checkpoint directory (its
latest step, merged).

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

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def adapter_of(model):
    """The state-dict adapter of ``model``'s registered family."""
    from mindformers_core.models import spec_of_model
    adapter = spec_of_model(model).state_dict_adapter
    if adapter is None:
        raise ValueError(f"convert_weight: {type(model).__name__} has no state_dict_adapter (register_model("
                         "..., state_dict_adapter=...)); nothing to convert with")
    return adapter


def global_names(model) -> Dict[str, str]:
    """``model``'s parameter names -> the same names with global layer indices (a pipeline stage's
    local ``decoder.layers.0`` is the model's layer ``layer_number - 1``)."""
    layers = getattr(getattr(model, "decoder", None), "layers", None)

    def rename(name):
        match = _LAYER.fullmatch(name)
        if not match or layers is None:
            return name
        return f"decoder.layers.{layers[int(match.group(1))].layer_number - 1}.{match.group(2)}"
    return {name: rename(name) for name, _ in model.parameters_and_names()}


def _numpy(param) -> np.ndarray:
    if param.dtype == ms.bfloat16:
        param = param.astype(ms.float32)
    return param.asnumpy()


def ms_to_hf(model) -> Dict[str, np.ndarray]:
    """``model``'s weights under its family's Hugging Face names and shapes."""
    names = global_names(model)
    return adapter_of(model).to_hf({names[n]: _numpy(p) for n, p in model.parameters_and_names()})


def hf_to_ms(model, hf: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The Hugging Face weights ``model`` holds, under ``model``'s parameter names and shapes.
    Raises KeyError naming a missing weight and ValueError naming a shape mismatch."""
    names = global_names(model)
    try:
        ours = adapter_of(model).from_hf(hf, names=list(names.values()))
    except KeyError as e:
        raise KeyError(f"convert_weight: {e.args[0]}") from None
    out = {}
    for name, param in model.parameters_and_names():
        data = ours[names[name]]
        if tuple(data.shape) != tuple(param.shape):
            raise ValueError(f"convert_weight: {name!r} needs {tuple(param.shape)} but the checkpoint gives "
                             f"{tuple(data.shape)} after conversion; does the config match the checkpoint?")
        out[name] = data
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


def load_ours(path: str) -> Dict[str, np.ndarray]:
    """Our tensors from one safetensors file, or from a trainer checkpoint directory (latest step)."""
    if not os.path.isdir(path):
        return load_safetensors(path)
    import tempfile
    from mindformers_core.checkpoint import load_single_file, merge_to_single_file
    with tempfile.TemporaryDirectory() as tmp:
        return load_single_file(merge_to_single_file(path, os.path.join(tmp, "merged.safetensors")))


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


def build_model(config: str, register_path=None):
    """The model the training YAML ``config`` names (``model.arch.type``), built in one process."""
    from mindformers_core.models import get_model_spec, import_register_path
    from mindformers_core.training import load_config
    if register_path:
        import_register_path(register_path)
    c = load_config(config)
    spec = get_model_spec(c.model.arch.type)
    return spec.model_class(spec.config_class.from_model_config(c.model.model_config.to_dict()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML with model.arch.type and model.model_config "
                                                        "(e.g. llama_tiny.yaml)")
    parser.add_argument("--direction", required=True, choices=("hf2ms", "ms2hf"))
    parser.add_argument("--input", required=True, help="a safetensors file (ms2hf: or a trainer checkpoint directory)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--register_path", default=None, help="directory of a user model family's code")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    model = build_model(args.config, args.register_path)
    if args.direction == "hf2ms":
        save_safetensors(hf_to_ms(model, load_safetensors(args.input)), args.output)
    else:
        load_into(model, load_ours(args.input))
        save_hf(model, args.output)
    print(f"convert_weight: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
