"""A Hugging Face model folder, opened as data: its files found and checked before anything is read.

What a folder may hold: ``config.json``, ``generation_config.json``, tokenizer files, and the weights as
``model.safetensors`` or shards listed by ``model.safetensors.index.json``. Nothing in it is executed:
Python files (``trust_remote_code`` models) are never imported, and pickled PyTorch weights
(``pytorch_model.bin``, ``*.pt``) are never unpickled -- unpickling runs code. A shard path in the index
that leaves the folder (``../``, absolute, a symlink out) is refused. Every safetensors header is checked
against its file's size, so a truncated file is named with the first tensor it cuts off, before any
process group exists.

Tensors are read by slice straight from the files, at the offsets the checked headers give (``pread`` into a
buffer of just the rows a slice covers; no memory map, so pages already read do not stay in the process):
a rank reads only the parts of each tensor it holds, and a large tensor can be read in row blocks.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

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
    offset: int = -1              # byte offset of its data in the file (-1: not known)


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
        """``read(name, slices or None) -> np.ndarray`` (a view of a buffer holding just the rows of the
        slice: only the bytes from the slice's first to its last row are read); ``KeyError`` for a tensor the
        folder does not hold. BF16 comes as MindSpore's NumPy ``bfloat16``. Files are opened once each,
        closed on exit."""
        with tensor_reader(self.tensors) as read:
            yield read


@contextlib.contextmanager
def tensor_reader(tensors: Mapping[str, "TensorInfo"], read_one=None) -> Iterator:
    """``read(name, slices or None)`` over ``tensors`` (name -> info with ``.file``): each file opened once, on
    first use, and closed on exit; ``KeyError`` for a name not held. ``read_one(fd, info, slices)`` reads one
    tensor (default: :func:`read_slice`, a safetensors tensor; MindFormers' ``.ckpt`` entries bring their own)."""
    read_one = read_one or read_slice
    with contextlib.ExitStack() as stack:
        handles = {}

        def read(name, slices=None):
            info = tensors.get(name)
            if info is None:
                raise KeyError(name)
            fd = handles.get(info.file)
            if fd is None:
                fd = handles[info.file] = os.open(info.file, os.O_RDONLY)
                stack.callback(os.close, fd)
            return read_one(fd, info, slices)
        yield read


def numpy_dtype(code: str) -> np.dtype:
    """The NumPy dtype of a safetensors dtype code, little-endian (``bfloat16``: MindSpore's, registered when
    MindSpore is imported)."""
    name = DTYPES[code][0]
    if name == "bfloat16":
        try:
            return np.dtype(name)
        except TypeError:
            import mindspore  # noqa: F401  (registers NumPy's bfloat16)
            return np.dtype(name)
    return np.dtype(name).newbyteorder("<")


def _pread_into(fd: int, buffer: np.ndarray, offset: int, where: str) -> None:
    view, done = memoryview(buffer).cast("B"), 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"{where}: the file ended {len(view) - done} bytes early (truncated while reading?)")
        done += n


def read_slice(fd: int, info: TensorInfo, slices=None) -> np.ndarray:
    """``slices`` (or all) of the tensor ``info`` from the open file ``fd``: the rows of dim 0 the slices
    cover are read into a new buffer (one read), the other dims' slices are views of it."""
    if info.offset < 0:
        raise ValueError(f"tensor {info.name!r}: its data offset is not known (read its header with "
                         "read_safetensors_header)")
    dtype, shape = numpy_dtype(info.dtype), tuple(info.shape)
    slices = tuple(slices) if slices is not None else ()
    if len(slices) > len(shape):
        raise IndexError(f"tensor {info.name!r} of shape {list(shape)}: {len(slices)} slices")
    slices = slices + (slice(None),) * (len(shape) - len(slices))
    if not shape:
        rows, first, rest = 1, 0, ()
    else:
        start, stop, step = slices[0].indices(shape[0])
        if step != 1:
            raise ValueError(f"tensor {info.name!r}: only slices with step 1 are read")
        first, rows, rest = start, max(stop - start, 0), slices[1:]
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(rows * row, np.uint8)
    _pread_into(fd, buffer, info.offset + first * row, f"{os.path.basename(info.file)}: tensor {info.name!r}")
    array = buffer.view(dtype).reshape((rows,) + shape[1:] if shape else ())
    if sys.byteorder != "little" and dtype.itemsize > 1 and dtype.name != "bfloat16":
        array = array.astype(dtype.newbyteorder("="))
    return array[(slice(None),) + rest] if shape else array


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
    base = 8 + n
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            start, end = int(start), int(end)
        except (KeyError, TypeError, ValueError):
            _fail(folder, f"{name}: tensor {key!r} has a malformed header entry {entry!r}")
        if dtype not in DTYPES:
            _fail(folder, f"{name}: tensor {key!r} has dtype {dtype!r}; readable: {sorted(DTYPES)}")
        if not 0 <= start <= end:
            _fail(folder, f"{name}: tensor {key!r} has data offsets {[start, end]}, not 0 <= start <= end")
        if end > data:
            _fail(folder, f"{name}: tensor {key!r} ends at byte {end} of the data but the file holds {data} data "
                          f"bytes: the file is truncated (download it again)")
        if end - start != int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][1]:
            _fail(folder, f"{name}: tensor {key!r} of {dtype}{list(shape)} has {end - start} bytes")
        out[key] = TensorInfo(key, path, dtype, shape, base + int(start))
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
