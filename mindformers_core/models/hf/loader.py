"""Hugging Face weights loaded straight onto a parallel layout: each rank reads only what it holds.

The targets are what the job needs -- per parameter of ours, its global shape and layout (the same
``{name: (global_shape, layout)}`` the trainer-checkpoint loader takes). For each one the rank's region
(``layout.local_slice``) is read through the family's name table (``models/state_dict.py``): a transposed
projection reads the transposed slice, a stacked expert weight reads only this rank's experts
(expert parallelism), a pipeline stage only its layers' tensors.

Nothing is read until a tensor is asked for, one at a time: :class:`HFWeights` is a mapping ``{our name:
this rank's region}`` whose values are read on access, and :func:`fill_parameter` reads one straight into a
parameter's own host memory in blocks of rows, converting on the way (bfloat16 -> float32 through the bits).
Loading a model this way holds at most one block of the file besides the parameters, at the speed of reading
the file (``bench/hf_load.py`` measures it); :func:`load_hf_weights` is the whole dict at once.

Before anything is read every target is checked: its Hugging Face tensors exist (with the family's
fallbacks, e.g. a tied ``lm_head``) and have the shapes the config implies; all problems are reported at
once, naming the tensor and the file.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

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


DType = Union[None, str, np.dtype, type, Mapping[str, object]]


def folder_holds(adapter: StateDictAdapter, name: str, shape: Sequence[int], tensors) -> bool:
    """Whether a folder with these tensor names (``tensors``, a set) holds every Hugging Face tensor our parameter
    ``name`` of ``shape`` reads (False for a parameter no row of the family's table names, e.g. LoRA's)."""
    try:
        return set(adapter.hf_names(name, tuple(shape))) <= tensors
    except KeyError:
        return False


class HFWeights(Mapping):
    """This rank's region of every target (``{name: (global_shape, layout)}`` or ``{name: global_shape}``),
    read from the folder only when asked for: ``weights[name]`` reads and returns one array,
    :meth:`read_into` fills a given array (e.g. a parameter's memory). Every target is checked when it is made
    (:class:`FolderError` listing every problem, before anything is read). ``dtype``: the dtype of the arrays
    (one for all, or ``{name: dtype}``; None or a name not in the mapping: the file's). Close it (or use it
    as a context manager) to close the files."""

    def __init__(self, folder: HFFolder, adapter: StateDictAdapter, targets: Mapping[str, object], rank: int = 0,
                 dtype: DType = None):
        problems = check_targets(folder, adapter, targets)
        if problems:
            raise FolderError(f"model folder {folder.path}: the weights do not fit the model:\n  - "
                              + "\n  - ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more"
                                                                 if len(problems) > 20 else ""))
        self.folder, self.adapter, self.rank, self.dtype = folder, adapter, rank, dtype
        self.targets = _normalize(targets)
        self._stack = contextlib.ExitStack()
        self._read = self._stack.enter_context(folder.reader())

    def region(self, name: str) -> Tuple[Tuple[int, int], ...]:
        """This rank's ``((start, stop), ...)`` of the global tensor ``name``."""
        shape, layout = self.targets[name]
        return _region(shape, layout, self.rank)

    def local_shape(self, name: str) -> Tuple[int, ...]:
        return tuple(b - a for a, b in self.region(name))

    def dtype_of(self, name: str) -> Optional[np.dtype]:
        dtype = self.dtype.get(name) if isinstance(self.dtype, Mapping) else self.dtype
        return None if dtype is None else np.dtype(dtype)

    def __getitem__(self, name: str) -> np.ndarray:
        shape, _ = self.targets[name]
        dtype = self.dtype_of(name)
        if dtype is None:
            return self.adapter.read(name, shape, self.region(name), self._read)
        return self.read_into(name, np.empty(self.local_shape(name), dtype))

    def read_into(self, name: str, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` (C-contiguous, this rank's region shape, any dtype) with ``name``'s region, read in
        blocks of rows and converted on the way; returns ``out``."""
        shape, _ = self.targets[name]
        local = self.local_shape(name)
        if tuple(out.shape) != local:
            raise ValueError(f"{name}: this rank's slice of the Hugging Face weights has shape {local}, the "
                             f"array to fill {tuple(out.shape)}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"{name}: read_into needs a writeable C-contiguous array")
        return self.adapter.read(name, shape, self.region(name), self._read, out=out)

    def __iter__(self) -> Iterator[str]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)

    def __contains__(self, name) -> bool:
        return name in self.targets

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "HFWeights":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()


def load_hf_weights(folder: HFFolder, adapter: StateDictAdapter, targets: Mapping[str, object], rank: int = 0,
                    dtype: DType = None) -> Dict[str, np.ndarray]:
    """``{our name: this rank's region}`` for every target (``{name: (global_shape, layout)}`` or
    ``{name: global_shape}``), all read at once. ``dtype``: cast every array (e.g. "float32" for a bf16 folder
    loaded into float32 parameters; or ``{name: dtype}``); None keeps the file's dtype. :class:`FolderError`
    lists every problem first. To hold one tensor at a time use :class:`HFWeights` / :func:`fill_parameter`."""
    with HFWeights(folder, adapter, targets, rank, dtype) as weights:
        return {name: weights[name] for name in weights}


def _host_buffer(param) -> Optional[np.ndarray]:
    """A NumPy view of ``param``'s own host memory (MindSpore's CPU tensors: ``asnumpy`` shares it), or None
    when ``asnumpy`` gives a copy (a device tensor) or a buffer that cannot be written in place."""
    try:
        a, b = param.asnumpy(), param.asnumpy()
    except Exception:                     # noqa: BLE001 -- any tensor that cannot give its memory: set_data
        return None
    if (a.flags.owndata or not a.flags.c_contiguous or not a.flags.writeable or a.size == 0
            or a.__array_interface__["data"][0] != b.__array_interface__["data"][0]):
        return None
    return a


def fill_parameter(weights: HFWeights, param, name: Optional[str] = None) -> None:
    """Load ``param`` (a MindSpore Parameter holding this rank's region of ``name``, default its own name)
    from ``weights``: straight into its host memory, converted to its dtype block by block (the same object
    and buffer, so optimizers and compiled graphs keep seeing it); where that memory is not reachable, one
    array in its dtype then ``set_data``."""
    name = param.name if name is None else name
    buffer = _host_buffer(param)
    if buffer is not None and tuple(buffer.shape) == weights.local_shape(name):
        weights.read_into(name, buffer)
        return
    import mindspore as ms
    local = weights.local_shape(name)
    if tuple(param.shape) != local:
        raise ValueError(f"{name}: this rank's slice of the Hugging Face weights has shape {local}, the parameter "
                         f"{tuple(param.shape)}")
    value = weights.read_into(name, np.empty(local, ms.dtype_to_nptype(param.dtype)))
    param.set_data(ms.Tensor.from_numpy(value))
