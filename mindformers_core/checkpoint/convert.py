"""Conversion between a distributed checkpoint and one safetensors file of full tensors.

``merge_to_single_file`` gives the file MindSpore's ``load_checkpoint(..., format="safetensors")``
and other tools read directly (e.g. for inference or export); ``shard_single_file`` starts a
parallel job from such a file, reading only each rank's byte ranges.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping

import numpy as np

from . import format as fmt
from .index import index_single_file
from .load import Step, open_checkpoint
from .reshard import TensorSpec, execute, normalize_targets, plan_load
from .save import write_safetensors


def merge_to_single_file(directory: str, out_path: str, *, step: Step = "latest",
                         include_optimizer: bool = False) -> str:
    """Write every full parameter (and with ``include_optimizer`` every moment, keyed
    ``optimizer/<state>/<param>``) of a step into ``out_path`` (``.safetensors`` is appended if
    missing), atomically. Holds all full tensors in memory at once."""
    index = open_checkpoint(directory, step)
    keys = [k for k, e in index.entries.items() if e.kind == "param" or include_optimizer]
    wanted = {k: TensorSpec(index.entries[k].global_shape) for k in keys}
    full = execute(plan_load(index, wanted, 0, pool=keys, strict=False))
    if not out_path.endswith(".safetensors"):
        out_path += ".safetensors"
    tmp = f"{out_path[:-len('.safetensors')]}.tmp-{os.getpid()}.safetensors"
    write_safetensors(tmp, full)
    os.replace(tmp, out_path)
    fmt.fsync_path(os.path.dirname(os.path.abspath(out_path)))
    return out_path


def load_single_file(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a safetensors file, validated (a truncated file is a CheckpointError)."""
    index = index_single_file(path)
    keys = list(index.entries)
    return execute(plan_load(index, {k: TensorSpec(index.entries[k].global_shape) for k in keys}, 0,
                             pool=keys, strict=False))


def shard_single_file(path: str, targets: Mapping[str, object], rank: int = 0, *,
                      strict: bool = True) -> Dict[str, np.ndarray]:
    """This rank's slices, in the target layouts, of the parameters in a file of full tensors.
    Same validation as :func:`load_checkpoint` (optimizer keys are never "unexpected")."""
    specs = normalize_targets(targets)
    index = index_single_file(path)
    return execute(plan_load(index, specs, rank, pool=index.names("param"), strict=strict))

