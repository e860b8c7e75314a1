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
    ``model_config`` keys overriding (e.g. ``seq_length=16``), and its weights loaded. Returns the model, which
    takes ids of any length up to config.json's ``max_position_embeddings`` (``seq_length`` need not be given:
    the family's default, at most that limit)."""
    import mindspore as ms
    spec, config, _ = read_hf_config(folder)
    config, positions = dict(config), config.get("max_position_embeddings")
    if positions and "seq_length" not in model_config:
        config["seq_length"] = min(int(config.get("seq_length") or positions), int(positions))
    config.update(model_config)
    model_cfg = spec.config_class.from_model_config(config)
    if positions and model_cfg.max_position_embeddings is None:     # the families' configs do not read the key
        model_cfg.max_position_embeddings = int(positions)
    model = spec.model_class(model_cfg)
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
