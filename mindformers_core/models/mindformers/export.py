"""Our weights written as a MindFormers checkpoint: through a MindFormers table (``names.py``: fused and stacked
tensors assembled) into one MindSpore ``.ckpt`` or ``.safetensors`` file, or MindFormers' unified folder
(``part<k>.safetensors`` of at most ``max_part_bytes`` each + ``param_name_map.json``, the form
``mindspore.parallel.unified_safetensors`` writes; MindFormers loads the folder with ``load_checkpoint: DIR``
and ``load_ckpt_format: safetensors``). Written into a staging path beside the target, flushed, renamed into
place: it appears whole or not at all. The values are bitwise ours (or cast to ``dtype``)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, Mapping, Optional

import numpy as np

from ..hf.export import _fsync_dir, shard_plan, staged_folder
from .ckpt import write_ckpt
from .files import INDEX_FILES
from .names import MFAdapter

DEFAULT_PART_BYTES = 2 * 1024 ** 3


def _save_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata={"format": "ms"})
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def mindformers_tensors(state: Mapping[str, np.ndarray], adapter: MFAdapter, dtype: Optional[str] = None
                        ) -> Dict[str, np.ndarray]:
    """Our state dict (whole tensors, global layer numbers) under MindFormers' names and layouts."""
    tensors = adapter.to_hf({k: np.asarray(v) for k, v in state.items()})
    if dtype is not None:
        tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def write_checkpoint(out: str, state: Mapping[str, np.ndarray], adapter: MFAdapter, dtype: Optional[str] = None,
                     max_part_bytes: int = DEFAULT_PART_BYTES, overwrite: bool = False) -> str:
    """Write ``state`` (our names) as a MindFormers checkpoint at ``out``: a file when it ends in ``.ckpt`` or
    ``.safetensors``, else the unified folder. Returns the path. ``out`` must not exist unless ``overwrite``."""
    out = os.path.abspath(out)
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"MindFormers export to {out}: it exists; choose a new path (or overwrite=True)")
    if max_part_bytes < 1:
        raise ValueError(f"max_part_bytes={max_part_bytes}: must be >= 1")
    tensors = mindformers_tensors(state, adapter, dtype)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    if out.endswith((".ckpt", ".safetensors")):
        fd, stage = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", dir=parent)
        os.close(fd)
        try:
            (write_ckpt if out.endswith(".ckpt") else _save_safetensors)(stage, tensors)
            os.chmod(stage, 0o644)
            os.replace(stage, out)
            _fsync_dir(parent)
        except BaseException:
            if os.path.exists(stage):
                os.remove(stage)
            raise
        return out
    with staged_folder(out) as stage:
        weight_map = {}
        for k, names in enumerate(shard_plan(tensors, max_part_bytes)):
            file = f"part{k}.safetensors"
            _save_safetensors(os.path.join(stage, file), {n: tensors[n] for n in names})
            weight_map.update({n: file for n in names})
        total = int(sum(v.nbytes for v in tensors.values()))
        with open(os.path.join(stage, INDEX_FILES[0]), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=4)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    return out


__all__ = ["write_checkpoint", "mindformers_tensors", "DEFAULT_PART_BYTES"]
