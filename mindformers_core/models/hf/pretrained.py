"""``from_pretrained(folder)``: a registered model built from a Hugging Face folder and its weights, on one
process (the trainer does the same on any layout: ``pretrained_model_dir`` + ``load_checkpoint``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .config import read_hf_config
from .folder import open_folder
from .loader import load_hf_weights


def from_pretrained(folder: str, **model_config: Any):
    """The folder's registered family (``architectures`` in config.json), its config from config.json with
    ``model_config`` keys overriding (e.g. ``seq_length=16``), and its weights loaded. Returns the model."""
    import mindspore as ms
    spec, config, _ = read_hf_config(folder)
    config = dict(config, **model_config)
    model = spec.model_class(spec.config_class.from_model_config(config))
    weights = list(model.trainable_params())
    adapter, held = spec.state_dict_adapter, set(open_folder(folder).tensors)
    for p in model.get_parameters():           # state the folder holds too (DeepSeek-V3's expert bias)
        if not p.requires_grad and _held(adapter, p, held):
            weights.append(p)
    values = load_hf_weights(open_folder(folder), adapter, {p.name: tuple(p.shape) for p in weights})
    for p in weights:
        p.set_data(ms.Tensor(np.asarray(values[p.name]).astype(ms.dtype_to_nptype(p.dtype))))
    return model



def _held(adapter, p, held) -> bool:
    try:
        return set(adapter.hf_names(p.name, tuple(p.shape))) <= held
    except KeyError:
        return False
