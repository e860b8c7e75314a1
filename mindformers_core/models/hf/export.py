"""Our weights written as a Hugging Face model folder that ``transformers`` loads.

``export_folder(out, state, adapter, config)``: the state dict (our names, whole tensors) through the
family's name table into Hugging Face names and shapes, written as safetensors shards of at most
``max_shard_bytes`` (``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, or one
``model.safetensors``), with ``config.json``, ``generation_config.json`` and the tokenizer files copied from
a source folder. The folder appears whole or not at all: everything is written into a staging directory
beside it, flushed, and renamed into place. The tensors are bitwise our values (in their dtype, or cast
to ``dtype``), so HF -> ours -> HF is the identity.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Dict, Iterator, List, Mapping, Optional

import numpy as np

from ..state_dict import StateDictAdapter
from .folder import CONFIG, GENERATION_CONFIG, INDEX, SINGLE, TOKENIZER_FILES

DEFAULT_SHARD_BYTES = 2 * 1024 ** 3


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged_folder(out: str) -> Iterator[str]:
    """A temporary folder beside ``out`` to write into, published as ``out`` when the block ends (its files
    already synced by the writer; the folder, the rename and the parent synced here; an older ``out`` replaced),
    removed if the block raises: nothing half-written is ever seen at ``out``."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    os.chmod(stage, 0o755)
    try:
        yield stage
        _fsync_dir(stage)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(stage, out)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def shard_plan(tensors: Mapping[str, np.ndarray], max_shard_bytes: int) -> List[List[str]]:
    """Names grouped into files of at most ``max_shard_bytes`` each (a bigger tensor gets a file of its own),
    in the dict's order."""
    shards, current, size = [], [], 0
    for name, array in tensors.items():
        n = int(np.asarray(array).nbytes)
        if current and size + n > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        shards.append(current)
    return shards


def export_folder(out: str, state: Mapping[str, np.ndarray], adapter: StateDictAdapter, config: Mapping,
                  generation_config: Optional[Mapping] = None, tokenizer_from: Optional[str] = None,
                  max_shard_bytes: int = DEFAULT_SHARD_BYTES, dtype: Optional[str] = None,
                  overwrite: bool = False) -> str:
    """Write the Hugging Face folder ``out`` (see the module doc) and return its path. ``state``: our
    parameter names (global layer numbers) -> whole arrays; ``config``: the config.json dict;
    ``tokenizer_from``: a folder whose tokenizer files are copied. ``out`` must not exist unless ``overwrite``."""
    from safetensors.numpy import save_file
    out = os.path.abspath(out)
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"export to {out}: it exists; choose a new folder (or overwrite=True)")
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes={max_shard_bytes}: must be >= 1")
    tensors = adapter.to_hf({k: np.asarray(v) for k, v in state.items()})
    if dtype is not None:
        tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    with staged_folder(out) as stage:
        groups = shard_plan(tensors, max_shard_bytes)
        if len(groups) == 1:
            save_file({k: tensors[k] for k in groups[0]}, os.path.join(stage, SINGLE), metadata={"format": "pt"})
        else:
            weight_map: Dict[str, str] = {}
            for k, names in enumerate(groups, 1):
                file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
                save_file({n: tensors[n] for n in names}, os.path.join(stage, file), metadata={"format": "pt"})
                weight_map.update({n: file for n in names})
            total = int(sum(v.nbytes for v in tensors.values()))
            _write_json(os.path.join(stage, INDEX), {"metadata": {"total_size": total}, "weight_map": weight_map})
        _write_json(os.path.join(stage, CONFIG), dict(config))
        if generation_config is not None:
            _write_json(os.path.join(stage, GENERATION_CONFIG), dict(generation_config))
        if tokenizer_from:
            for name in TOKENIZER_FILES:
                src = os.path.join(tokenizer_from, name)
                if os.path.isfile(src):
                    shutil.copyfile(src, os.path.join(stage, name))
        for name in os.listdir(stage):
            with open(os.path.join(stage, name), "rb") as f:
                os.fsync(f.fileno())
    return out
