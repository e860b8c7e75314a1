"""``from_pretrained(folder)``: a registered model built from a Hugging Face folder and its weights, on one
process (the trainer does the same on any layout: ``pretrained_model_dir`` + ``load_checkpoint``)."""
from __future__ import annotations

from typing import Any

from ...common.graphs import eager_ops_in_calling_thread
from ...transformer.init import deferred_init
from .config import read_hf_config
from .folder import open_folder
from .loader import HFWeights, fill_parameter, folder_holds


def from_pretrained(folder: str, **model_config: Any):
    """The folder's registered family (``architectures`` in config.json), its config from config.json with
    ``model_config`` keys overriding (e.g. ``seq_length=16``), and its weights loaded. Returns the model, which
    takes ids of any length up to config.json's ``max_position_embeddings`` (``seq_length`` need not be given:
    the family's default, at most that limit). On CPU it also makes eager ops run in the calling thread
    (``common.graphs.eager_ops_in_calling_thread``; ``MFC_PYNATIVE_SYNC=0`` keeps MindSpore's dispatch queue):
    Qwen3-0.6B's PyNative forward takes 0.8-0.9 s that way against 3.7-4.8 s queued."""
    spec, config, _ = read_hf_config(folder)
    eager_ops_in_calling_thread()
    config, positions = dict(config), config.get("max_position_embeddings")
    if positions and "seq_length" not in model_config:
        config["seq_length"] = min(int(config.get("seq_length") or positions), int(positions))
    config.update(model_config)
    model_cfg = spec.config_class.from_model_config(config)
    if positions and model_cfg.max_position_embeddings is None:     # the families' configs do not read the key
        model_cfg.max_position_embeddings = int(positions)
    hf = open_folder(folder)
    adapter, held = spec.state_dict_adapter, set(hf.tensors)
    with deferred_init() as deferred:          # no random draws for weights the folder overwrites
        model = spec.model_class(model_cfg)
    weights = list(model.trainable_params())
    for p in model.get_parameters():           # state the folder holds too (DeepSeek-V3's expert bias)
        if not p.requires_grad and folder_holds(adapter, p.name, p.shape, held):
            weights.append(p)
    # checked first (every missing or misshaped tensor named), then read one tensor at a time straight into
    # each parameter's memory, converted to its dtype on the way
    with HFWeights(hf, adapter, {p.name: tuple(p.shape) for p in weights}) as values:
        for p in weights:
            fill_parameter(values, p)
    deferred.materialize(loaded=weights)       # anything the folder did not give: its usual random draw
    return model

