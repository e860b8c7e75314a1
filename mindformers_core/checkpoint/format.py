"""The on-disk format: directory names, the ``latest`` tracker, per-rank JSON, atomic writes.

::

    <directory>/
      latest_checkpointed_iteration.txt    step of the newest complete checkpoint (Megatron's name)
      step_<k>/                            appears only once every rank's files are in it
        metadata.json                      written last by rank 0: format, step, world_size, files
        rank_<r>.safetensors               the shards rank r writes (MindSpore's safetensors writer)
        rank_<r>.json                      per tensor: global shape, dtype, layout, global slice;
                                           the sha256 of rank_<r>.safetensors (checked at load)
      step_<k>.tmp/                        staging directory while a save is in progress

Every file is written to a temporary name in its final directory and moved into place with
``os.replace``; the step directory is renamed from its staging name only after all ranks
finished, and the tracker is replaced last. A crash at any point leaves the previous complete
checkpoint as ``latest`` and no partial ``step_<k>``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from types import SimpleNamespace
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..sharding.layout import Layout, as_layout
from .errors import CheckpointError, Problem

FORMAT = "mindformers_core.checkpoint"
VERSION = 1
TRACKER = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
OPTIMIZER_PREFIX = "optimizer/"
_STEP_RE = re.compile(r"^step_(\d+)$")

# safetensors header dtype codes -> NumPy dtype names (MindSpore registers numpy "bfloat16")
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64",
                      "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}


# ---- names ------------------------------------------------------------------------------------
def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step_{step}")


def staging_dir(directory: str, step: int) -> str:
    """Same name on every rank (no pid): all ranks must agree on it without communicating."""
    return os.path.join(directory, f"step_{step}.tmp")


def rank_stem(rank: int) -> str:
    return f"rank_{rank}"


def optimizer_key(state: str, param: str) -> str:
    return f"{OPTIMIZER_PREFIX}{state}/{param}"


# ---- atomic files -----------------------------------------------------------------------------
def fsync_path(path: str) -> None:
    """Flush a file (or a directory entry) to disk; best effort on filesystems that refuse."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str, text: str) -> None:
    """Write ``path`` so that readers see the old content or the new one, never a mix."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path) or ".")


def write_json_atomic(path: str, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def read_json(path: str) -> Tuple[Optional[dict], Optional[Problem]]:
    """(content, None) or (None, the problem), never an exception: callers collect problems."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return None, Problem("file is missing", file=name, found=f"no file at {path}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return None, Problem("corrupt JSON", file=name, expected="a JSON object", found=f"{type(e).__name__}: {e}")
    if not isinstance(data, dict):
        return None, Problem("corrupt JSON", file=name, expected="a JSON object", found=type(data).__name__)
    return data, None


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes (read in 8 MB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


_LEFTOVER = re.compile(r"^(step_\d+\.tmp|step_\d+\.old-\d+|.*\.tmp-\d+)$")


def remove_leftovers(directory: str, below: Optional[int] = None) -> List[str]:
    """Delete what interrupted saves left behind in a checkpoint directory: staging directories
    (``step_<k>.tmp``), steps moved aside by a re-save (``step_<k>.old-<pid>``) and half-written
    files (``*.tmp-<pid>``). With ``below``, staging directories of steps >= ``below`` are kept
    (another rank may be writing the next save already). Returns the names removed."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if not _LEFTOVER.match(name):
            continue
        staged = re.match(r"^step_(\d+)\.tmp$", name)
        if staged and below is not None and int(staged.group(1)) >= below:
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                continue
        removed.append(name)
    return removed


# ---- tracker and steps ------------------------------------------------------------------------
def list_steps(directory: str) -> List[int]:
    """Steps with a complete (published) directory, ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for n in os.listdir(directory) if (m := _STEP_RE.match(n))
                  and os.path.isdir(os.path.join(directory, n)))


def read_tracker(directory: str) -> Optional[int]:
    path = os.path.join(directory, TRACKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise CheckpointError(f"checkpoint {directory}", [Problem(
            "corrupt tracker file", file=TRACKER, expected="a step number", found=repr(text[:80]))])
    return int(text)


def resolve_step(directory: str, step: Union[int, str] = "latest") -> int:
    """``"latest"`` -> the tracker's step (or, if the tracker is missing, the highest published
    step directory); an int is checked to exist."""
    where = f"checkpoint {directory}"
    if step == "latest":
        found = read_tracker(directory)
        if found is None:
            steps = list_steps(directory)
            if not steps:
                raise CheckpointError(where, [Problem(
                    "no checkpoint here", file=TRACKER, expected=f"{TRACKER} or step_<k>/ directories",
                    found=sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory")])
            found = steps[-1]
        step = found
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"load: step={step!r} must be 'latest' or a non-negative int")
    if not os.path.isdir(step_dir(directory, int(step))):
        raise CheckpointError(where, [Problem(
            f"step_{step} is not a complete checkpoint", file=f"step_{step}",
            expected="a published step directory", found=f"published steps {list_steps(directory)}")])
    return int(step)


# ---- layouts and dtypes -----------------------------------------------------------------------
def layout_to_dict(layout: Optional[Layout]) -> Optional[dict]:
    """MindSpore's ``Layout.to_dict()`` keys (JSON-friendly lists); None = replicated everywhere."""
    if layout is None:
        return None
    d = layout.to_dict()
    return {"device_matrix": list(d["device_matrix"]), "alias_name": list(d["alias_name"]),
            "tensor_map": [list(m) if isinstance(m, (tuple, list)) else m for m in d["tensor_map"]],
            "rank_list": list(d["rank_list"]),
            "interleaved_parallel": bool(d.get("interleaved_parallel", False))}


def layout_from_dict(d: Optional[dict]) -> Optional[Layout]:
    """Inverse of :func:`layout_to_dict` (through ``as_layout``, so the tensor_map rules are the
    sharding package's)."""
    if d is None:
        return None
    return as_layout(SimpleNamespace(to_dict=lambda: d))


def dtype_name(dtype) -> str:
    """A NumPy dtype name for a NumPy dtype, a MindSpore dtype or a string ("float32", "Float32")."""
    if dtype is None:
        raise ValueError("dtype_name: dtype is None")
    try:
        return np.dtype(dtype).name
    except TypeError:
        pass
    try:
        import mindspore as ms
        if isinstance(dtype, ms.dtype.Type):
            return np.dtype(ms.dtype_to_nptype(dtype)).name
    except (ImportError, TypeError, KeyError):
        pass
    if isinstance(dtype, str):
        try:
            return np.dtype(dtype.lower()).name
        except TypeError:
            pass
    raise ValueError(f"dtype {dtype!r} is not a NumPy or MindSpore dtype")


def slice_to_json(sl: Sequence[slice]) -> List[List[int]]:
    return [[s.start, s.stop] for s in sl]


def shape_of(region: Sequence[Sequence[int]]) -> Tuple[int, ...]:
    return tuple(b - a for a, b in region)


def describe_region(region: Sequence[Sequence[int]]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in region) + "]"
