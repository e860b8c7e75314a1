"""A MindFormers checkpoint, opened as data: which files hold which tensors, checked before anything is read.

What MindFormers writes and what is read here (nothing is unpickled or executed):

- one file: MindSpore's ``.ckpt`` (``mindspore.save_checkpoint``; the legacy trainer's
  ``rank_0/<prefix>-<epoch>_<step>.ckpt``) or ``.safetensors`` (``format="safetensors"``);
- MindFormers' unified (merged) folder: the ``*.safetensors`` files and the index ``mindspore.parallel.
  unified_safetensors`` writes beside them, ``param_name_map.json`` (``{"weight_map": {name: file}}``), or the same
  index as ``model.safetensors.index.json`` (without ``config.json``: with it the folder is a Hugging Face one);
- MindFormers 2.x's checkpoint folder (``latest_checkpointed_iteration.txt`` and ``iteration_<n>/``, or one
  ``iteration_<n>/``) saved by one rank: its ``model-0000000-0000001.safetensors``. One saved by several ranks
  holds slices of the tensors (their offsets in ``metadata.json``): merge it with MindFormers first.

:func:`open_checkpoint` returns an object shaped like ``models.hf.folder.HFFolder`` (``path``, ``tensors``,
``files``, ``reader()``), so the Hugging Face loader (``models.hf.loader.HFWeights``) reads it by slice through a
MindFormers name table (``models.mindformers.names``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

from ..hf.folder import FolderError, TensorInfo, _inside, read_safetensors_header
from .ckpt import CkptTensorInfo, read_ckpt_index, read_ckpt_slice

INDEX_FILES = ("param_name_map.json", "model.safetensors.index.json")
TRACKER = "latest_checkpointed_iteration.txt"
ITERATION = re.compile(r"iteration_(\d+)$")
MODEL_FILE = re.compile(r"(?:.*-)?model-(\d{7})-(\d{7})\.safetensors$")


@dataclass
class MFCheckpoint:
    """A checked MindFormers checkpoint: ``tensors`` (name -> TensorInfo over every file), ``files``."""
    path: str
    tensors: Dict[str, TensorInfo] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)          # (HFFolder's shape; a MindFormers checkpoint has none)

    @contextlib.contextmanager
    def reader(self) -> Iterator:
        """``read(name, slices or None) -> np.ndarray`` as ``HFFolder.reader``; ``KeyError`` for a tensor the
        checkpoint does not hold."""
        from ..hf.folder import read_slice, tensor_reader

        def read_one(fd, info, slices):
            return (read_ckpt_slice if isinstance(info, CkptTensorInfo) else read_slice)(fd, info, slices)
        with tensor_reader(self.tensors, read_one) as read:
            yield read


def _fail(path: str, what: str):
    raise FolderError(f"MindFormers checkpoint {path}: {what}")


def _file_tensors(path: str) -> Dict[str, TensorInfo]:
    if path.endswith(".ckpt"):
        return read_ckpt_index(path)
    if path.endswith(".safetensors"):
        return read_safetensors_header(path, os.path.dirname(path))
    _fail(path, "a file, but not .ckpt or .safetensors")


def _flatten_experts(tensors: Dict[str, TensorInfo]) -> None:
    """MindFormers' routed experts come as 2-D ``(E*in, out)`` (its graph-mode GroupedMLP parameter) or 3-D
    ``(E, in, out)`` (its Hugging Face loader's and PyNative model's): the same bytes; seen as 2-D here."""
    for name, info in tensors.items():
        if name.endswith((".experts.weight1", ".experts.weight2")) and len(info.shape) == 3:
            info.shape = (info.shape[0] * info.shape[1], info.shape[2])


def _from_index(folder: str, index_path: str) -> MFCheckpoint:
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        _fail(folder, f"{os.path.basename(index_path)} cannot be read as JSON ({e})")
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        _fail(folder, f"{os.path.basename(index_path)} has no weight_map naming each tensor's file")
    files: Dict[str, List[str]] = {}
    for tensor, relative in weight_map.items():
        real = _inside(folder, relative) if isinstance(relative, str) else None
        if real is None:
            _fail(folder, f"{os.path.basename(index_path)}: tensor {tensor!r} is mapped to {relative!r}, outside the "
                          "folder (only files inside it are read)")
        if not os.path.isfile(real):
            _fail(folder, f"{os.path.basename(index_path)}: tensor {tensor!r} is in {relative!r}, which is missing")
        files.setdefault(real, []).append(tensor)
    out = MFCheckpoint(folder)
    for real, names in sorted(files.items()):
        header = _file_tensors(real)
        for tensor in names:
            if tensor not in header:
                _fail(folder, f"{os.path.basename(index_path)} puts tensor {tensor!r} in {os.path.basename(real)}, "
                              "which does not hold it")
            out.tensors[tensor] = header[tensor]
    out.files = sorted(files)
    return out


def _iteration_dir(path: str) -> Optional[str]:
    """The iteration folder of a MindFormers 2.x checkpoint root (its tracker) or the folder itself."""
    tracker = os.path.join(path, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker, encoding="utf-8") as f:
            text = f.read().strip()
        if not text.isdigit():
            _fail(path, f"{TRACKER} holds {text!r}, not an iteration number")
        it = os.path.join(path, f"iteration_{int(text):08d}")
        if not os.path.isdir(it):
            _fail(path, f"{TRACKER} names iteration {int(text)} but {os.path.basename(it)}/ is missing")
        return it
    if ITERATION.match(os.path.basename(os.path.normpath(path))):
        return path
    return None


def is_mindformers_dir(path: str) -> bool:
    """A folder :func:`open_checkpoint` reads: an index without config.json, or a MindFormers 2.x root whose
    tracker names an existing ``iteration_<8 digits>/`` (our own roots share the tracker's name but hold
    ``step_<k>/``), or such an iteration folder, with a ``model-*.safetensors`` file. Never raises."""
    try:
        if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
            return False
        if any(os.path.isfile(os.path.join(path, f)) for f in INDEX_FILES):
            return True
        it = None
        tracker = os.path.join(path, TRACKER)
        if os.path.isfile(tracker):
            with open(tracker, encoding="utf-8") as f:
                text = f.read().strip()
            if text.isdigit() and os.path.isdir(os.path.join(path, f"iteration_{int(text):08d}")):
                it = os.path.join(path, f"iteration_{int(text):08d}")
        elif ITERATION.match(os.path.basename(os.path.normpath(path))):
            it = path
        return it is not None and any(MODEL_FILE.match(f) for f in os.listdir(it))
    except OSError:
        return False


def open_checkpoint(path: str) -> MFCheckpoint:
    """Find and check a MindFormers checkpoint's files (see the module doc); :class:`FolderError` names what is
    wrong. Reads only the indexes and the files' headers (a ``.ckpt`` file is walked once for its entries)."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.exists(path):
        raise FolderError(f"MindFormers checkpoint {path!r}: no such file or directory")
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(path):
        out = MFCheckpoint(path, _file_tensors(path), [path])
    else:
        index = next((os.path.join(path, f) for f in INDEX_FILES if os.path.isfile(os.path.join(path, f))), None)
        if index is not None:
            out = _from_index(path, index)
        else:
            it = _iteration_dir(path)
            if it is None:
                _fail(path, f"a folder with neither {' nor '.join(INDEX_FILES)} nor {TRACKER} / iteration_<n>/ "
                            "(give the .ckpt / .safetensors file, or MindFormers' unified folder with its index)")
            models = sorted(f for f in os.listdir(it) if MODEL_FILE.match(f))
            if not models:
                _fail(it, "no model-<rank>-<ranks>.safetensors file")
            ranks = int(MODEL_FILE.match(models[0]).group(2))
            if ranks != 1 or len(models) != 1:
                _fail(it, f"saved by {ranks} ranks ({len(models)} model files): each holds slices of the tensors; "
                          "merge it into one folder first (MindFormers: mindspore.parallel.unified_safetensors, or "
                          "its checkpoint conversion tool) and give that folder")
            file = os.path.join(it, models[0])
            out = MFCheckpoint(path, _file_tensors(file), [file])
    if not out.tensors:
        _fail(path, "holds no tensors")
    _flatten_experts(out.tensors)
    return out


__all__ = ["MFCheckpoint", "open_checkpoint", "is_mindformers_dir", "INDEX_FILES"]
