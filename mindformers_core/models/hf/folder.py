"""A Hugging Face model folder, opened as data: its files found and checked before anything is read.

What a folder may hold: ``config.json``, ``generation_config.json``, tokenizer files, and the weights as
``model.safetensors`` or shards listed by ``model.safetensors.index.json``. Nothing in it is executed:
Python files (``trust_remote_code`` models) are never imported, and pickled PyTorch weights
(``pytorch_model.bin``, ``*.pt``) are never unpickled -- unpickling runs code. A shard path in the index
that leaves the folder (``../``, absolute, a symlink out) is refused. Every safetensors header is checked
against its file's size, so a truncated file is named with the first tensor it cuts off, before any
process group exists.

Tensors are read by slice through the ``safetensors`` package: a rank reads only the parts of each
tensor it holds.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")
# safetensors dtype code -> (NumPy dtype name, bytes per element)
DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
          "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
          "BOOL": ("bool", 1)}


class FolderError(ValueError):
    """A model folder that cannot be used; the message names the folder, the file and the tensor or key."""


@dataclass
class TensorInfo:
    name: str
    file: str                     # path of the safetensors file holding it
    dtype: str                    # safetensors code (F32, BF16, ...)
    shape: Tuple[int, ...]


@dataclass
class HFFolder:
    """A checked model folder: ``config`` (config.json as a dict), ``generation_config`` (or None),
    ``tensors`` (name -> TensorInfo over every weight file), ``files`` (the weight files)."""
    path: str
    config: dict
    generation_config: Optional[dict]
    tensors: Dict[str, TensorInfo] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)

    @property
    def tokenizer_files(self) -> List[str]:
        return [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(self.path, f))]

    @contextlib.contextmanager
    def reader(self) -> Iterator:
        """``read(name, slices or None) -> np.ndarray`` reading through safetensors' slices; ``KeyError``
        for a tensor the folder does not hold. Files are opened once each, closed on exit."""
        from safetensors import safe_open
        with contextlib.ExitStack() as stack:
            handles = {}

            def read(name, slices=None):
                info = self.tensors.get(name)
                if info is None:
                    raise KeyError(name)
                f = handles.get(info.file)
                if f is None:
                    f = handles[info.file] = stack.enter_context(safe_open(info.file, framework="np"))
                if slices is None:
                    return f.get_tensor(name)
                return f.get_slice(name)[tuple(slices)]
            yield read


def _fail(path: str, what: str) -> None:
    raise FolderError(f"model folder {path}: {what}")


def _read_json(path: str, folder: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        _fail(folder, f"{os.path.basename(path)} is not valid JSON (line {e.lineno}: {e.msg})")
    except OSError as e:
        _fail(folder, f"{os.path.basename(path)} cannot be read ({e})")
    if not isinstance(value, dict):
        _fail(folder, f"{os.path.basename(path)} must hold a JSON object, got {type(value).__name__}")
    return value


def _inside(folder: str, relative: str) -> Optional[str]:
    """The real path of ``relative`` when it stays inside ``folder`` (None when it leaves it)."""
    if os.path.isabs(relative) or not relative:
        return None
    real_folder = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(folder, relative))
    return real if os.path.commonpath([real_folder, real]) == real_folder else None


def read_safetensors_header(path: str, folder: str) -> Dict[str, TensorInfo]:
    """The tensors of one safetensors file, checked against the file's size: a header that is not JSON, a
    dtype not known, a tensor whose bytes do not match its shape or lie past the end of the file (a
    truncated download) is a :class:`FolderError` naming the file and the tensor."""
    name = os.path.basename(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            _fail(folder, f"{name} is not a safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            _fail(folder, f"{name}: its header says {n} bytes but the file has {size} (truncated)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            _fail(folder, f"{name}: the safetensors header is not valid JSON ({e})")
    data = size - 8 - n
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            _fail(folder, f"{name}: tensor {key!r} has a malformed header entry {entry!r}")
        if dtype not in DTYPES:
            _fail(folder, f"{name}: tensor {key!r} has dtype {dtype!r}; readable: {sorted(DTYPES)}")
        if end > data:
            _fail(folder, f"{name}: tensor {key!r} ends at byte {end} of the data but the file holds {data} data "
                          f"bytes: the file is truncated (download it again)")
        if end - start != int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][1]:
            _fail(folder, f"{name}: tensor {key!r} of {dtype}{list(shape)} has {end - start} bytes")
        out[key] = TensorInfo(key, path, dtype, shape)
    return out


def open_folder(path: str) -> HFFolder:
    """Find and check a model folder's files (see the module doc); :class:`FolderError` names what is
    wrong. Reads only config.json, generation_config.json, the index and the safetensors headers."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        raise FolderError(f"model folder {path!r}: no such directory"
                          + (" (this is a file; give the folder that holds config.json)" if path and
                             os.path.isfile(path) else "") +
                          "; a Hugging Face model name must be downloaded first (huggingface-cli download NAME "
                          "--local-dir DIR), nothing is fetched from the network here")
    path = os.path.abspath(os.fspath(path))
    config_path = os.path.join(path, CONFIG)
    if not os.path.isfile(config_path):
        _fail(path, f"no {CONFIG} (a Hugging Face model folder holds config.json, the weights as *.safetensors "
                    "and the tokenizer files)")
    config = _read_json(config_path, path)
    gen_path = os.path.join(path, GENERATION_CONFIG)
    generation = _read_json(gen_path, path) if os.path.isfile(gen_path) else None
    folder = HFFolder(path, config, generation)
    index_path = os.path.join(path, INDEX)
    if os.path.isfile(index_path):
        index = _read_json(index_path, path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            _fail(path, f"{INDEX} has no 'weight_map' object naming each tensor's file")
        files = {}
        for tensor, relative in weight_map.items():
            real = _inside(path, relative) if isinstance(relative, str) else None
            if real is None:
                _fail(path, f"{INDEX}: tensor {tensor!r} is mapped to {relative!r}, which is outside the folder "
                            "(only files inside the model folder are read)")
            if not os.path.isfile(real):
                _fail(path, f"{INDEX}: tensor {tensor!r} is in {relative!r}, which is missing")
            files.setdefault(real, []).append(tensor)
        for real, names in sorted(files.items()):
            header = read_safetensors_header(real, path)
            for tensor in names:
                if tensor not in header:
                    _fail(path, f"{INDEX} puts tensor {tensor!r} in {os.path.basename(real)}, which does not hold it")
                folder.tensors[tensor] = header[tensor]
        folder.files = sorted(files)
        return folder
    single = os.path.join(path, SINGLE)
    if os.path.isfile(single):
        folder.tensors = read_safetensors_header(single, path)
        folder.files = [single]
        return folder
    others = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    pickled = sorted(f for f in os.listdir(path) if f.endswith(PICKLED))
    if others:
        _fail(path, f"weights {others[:3]} without {INDEX}: give the index that maps each tensor to its file")
    if pickled:
        _fail(path, f"only pickled PyTorch weights ({', '.join(pickled[:3])}): they are not read, because "
                    "unpickling runs code; use the safetensors files of the model (or convert once with "
                    "transformers: model.save_pretrained(dir, safe_serialization=True))")
    _fail(path, f"no weights: neither {SINGLE} nor {INDEX}")
