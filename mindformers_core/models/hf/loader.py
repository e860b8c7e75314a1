"""Hugging Face weights loaded straight onto a parallel layout: each rank reads only what it holds.

The targets are what the job needs -- per parameter of ours, its global shape and layout (the same
``{name: (global_shape, layout)}`` the trainer-checkpoint loader takes). For each one the rank's region
(``layout.local_slice``) is read through the family's name table (``models/state_dict.py``): a transposed
projection reads the transposed slice, a stacked expert weight reads only this rank's experts
(expert parallelism), a pipeline stage only its layers' tensors. Peak memory per rank is therefore near
its shard, not the whole model (``bench/hf_load.py`` measures it).

Before anything is read every target is checked: its Hugging Face tensors exist (with the family's
fallbacks, e.g. a tied ``lm_head``) and have the shapes the config implies; all problems are reported at
once, naming the tensor and the file.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..state_dict import StateDictAdapter
from .folder import FolderError, HFFolder


def _region(shape: Sequence[int], layout, rank: int) -> Tuple[Tuple[int, int], ...]:
    if layout is None:
        return tuple((0, int(n)) for n in shape)
    return tuple((s.start, s.stop) for s in layout.local_slice(tuple(shape), rank))


def _normalize(targets: Mapping[str, object]) -> Dict[str, Tuple[Tuple[int, ...], object]]:
    out = {}
    for name, spec in targets.items():
        if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], (tuple, list)):
            out[name] = (tuple(int(d) for d in spec[0]), spec[1])
        else:                               # a plain shape: the whole tensor
            out[name] = (tuple(int(d) for d in spec), None)
    return out


def check_targets(folder: HFFolder, adapter: StateDictAdapter, targets: Mapping[str, object]) -> List[str]:
    """Every problem with loading ``targets`` from ``folder``: a parameter of ours no row of the family's
    table names, a Hugging Face tensor missing (after fallbacks), a shape that does not match."""
    problems = []
    for name, (shape, _) in _normalize(targets).items():
        try:
            wanted = adapter.hf_shapes(name, shape)
        except KeyError as e:
            problems.append(f"parameter {name!r}: {e.args[0]}")
            continue
        for hf, hf_shape in wanted.items():
            info = folder.tensors.get(hf)
            if info is None and hf in adapter.fallbacks:
                info = folder.tensors.get(adapter.fallbacks[hf])
            if info is None:
                problems.append(f"tensor {hf!r} (for our {name}) is not in the folder's weights "
                                f"({', '.join(sorted({f.rsplit('/', 1)[-1] for f in folder.files}))})")
            elif tuple(info.shape) != tuple(hf_shape):
                problems.append(f"tensor {hf!r} in {info.file.rsplit('/', 1)[-1]} has shape {list(info.shape)}, "
                                f"the model config gives {list(hf_shape)} (for our {name}): does config.json "
                                "match the weights, and the YAML's model_config overrides the folder's?")
    return problems


def unused_tensors(folder: HFFolder, adapter: StateDictAdapter, names: Sequence[str]) -> List[str]:
    """Hugging Face tensors of the folder that no parameter in ``names`` reads and the family does not ignore
    (a whole-model load that leaves some out means the config describes a smaller model)."""
    names, sources = set(names), set(adapter.fallbacks.values())
    out = []
    for hf in folder.tensors:
        try:
            ours = adapter.ours_of_hf(hf)
        except KeyError:
            out.append(hf)
            continue
        if ours is not None and ours not in names and hf not in sources:
            out.append(hf)
    return sorted(out)


def load_hf_weights(folder: HFFolder, adapter: StateDictAdapter, targets: Mapping[str, object], rank: int = 0,
                    dtype: Optional[str] = None) -> Dict[str, np.ndarray]:
    """``{our name: this rank's region}`` for every target (``{name: (global_shape, layout)}`` or
    ``{name: global_shape}``). ``dtype``: cast every array (e.g. "float32" for a bf16 folder loaded into
    float32 parameters); None keeps the file's dtype. :class:`FolderError` lists every problem first."""
    problems = check_targets(folder, adapter, targets)
    if problems:
        raise FolderError(f"model folder {folder.path}: the weights do not fit the model:\n  - "
                          + "\n  - ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more"
                                                             if len(problems) > 20 else ""))
    out = {}
    with folder.reader() as read:
        for name, (shape, layout) in _normalize(targets).items():
            array = adapter.read(name, shape, _region(shape, layout, rank), read)
            out[name] = array.astype(dtype) if dtype is not None and array.dtype != np.dtype(dtype) else array
    return out
