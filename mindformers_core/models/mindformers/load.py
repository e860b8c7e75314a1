"""A MindFormers checkpoint's weights for our parameters, read by slice onto any layout (the Hugging Face loader's
machinery: ``models.hf.loader.HFWeights`` over a :class:`~.files.MFCheckpoint` and a MindFormers table)."""
from __future__ import annotations

from typing import Mapping, Optional

from ..hf.folder import FolderError
from ..hf.loader import HFWeights, fill_parameter, unused_tensors
from .files import MFCheckpoint, open_checkpoint
from .names import IGNORED, MFAdapter, adapter_for, detect_scheme, scheme_problem


def checkpoint_adapter(ckpt: MFCheckpoint, model_type: Optional[str], config,
                       model_config: Optional[Mapping] = None) -> MFAdapter:
    """The table for reading ``ckpt`` into a model of ``config``: the scheme its names use (a
    :class:`FolderError` naming the checkpoint when they follow none)."""
    scheme = detect_scheme(ckpt.tensors)
    if scheme is None:
        raise FolderError(f"MindFormers checkpoint {scheme_problem(ckpt.path, list(ckpt.tensors))}")
    return adapter_for(model_type, config, ckpt.tensors, scheme, model_config)


def mindformers_weights(ckpt: MFCheckpoint, adapter: MFAdapter, targets: Mapping[str, object], rank: int = 0,
                        dtype=None) -> HFWeights:
    """``HFWeights`` over a MindFormers checkpoint: every target checked first (a missing tensor, a wrong shape:
    one :class:`FolderError` naming each, the checkpoint and its scheme), then read on access."""
    try:
        return HFWeights(ckpt, adapter, targets, rank, dtype)
    except FolderError as e:
        text = str(e).replace(f"model folder {ckpt.path}", f"MindFormers checkpoint {ckpt.path} ({adapter.scheme} "
                                                            "names)", 1)
        raise FolderError(text.replace("the folder's weights", "the checkpoint")
                          .replace("does config.json match the weights, and the YAML's model_config overrides the "
                                   "folder's?", "does the model config (sizes, heads) match the checkpoint's?")) from None


def unused(ckpt: MFCheckpoint, adapter: MFAdapter, names) -> list:
    """Weights of the checkpoint no parameter in ``names`` reads (optimizer state and counters aside)."""
    return [n for n in unused_tensors(ckpt, adapter, list(names)) if not IGNORED.search(n)]


def load_mindformers(model, path: str, model_type: Optional[str] = None, model_config: Optional[Mapping] = None
                     ) -> MFCheckpoint:
    """Load a MindFormers checkpoint (file or folder, ``files.open_checkpoint``) into ``model`` (one process: every
    parameter whole), each parameter read straight into its memory. ``model_type``: the family (default: the
    registered family of the model's class); ``model_config``: MindFormers' layout keys
    (``use_contiguous_weight_layout_attention``, ...). Returns the opened checkpoint."""
    if model_type is None:
        from ..registry import spec_of_model
        model_type = spec_of_model(model).model_type
    ckpt = open_checkpoint(path)
    adapter = checkpoint_adapter(ckpt, model_type, model.config, model_config)
    params = list(model.trainable_params())
    held = set(ckpt.tensors)
    for p in model.get_parameters():                 # state the checkpoint holds too (the expert bias)
        if not p.requires_grad:
            try:
                if set(adapter.hf_names(p.name, tuple(p.shape))) <= held:
                    params.append(p)
            except KeyError:
                pass
    with mindformers_weights(ckpt, adapter, {p.name: tuple(p.shape) for p in params}) as values:
        for p in params:
            fill_parameter(values, p)
    return ckpt


__all__ = ["checkpoint_adapter", "mindformers_weights", "load_mindformers", "unused"]
