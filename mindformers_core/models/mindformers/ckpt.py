"""MindSpore's ``.ckpt`` files read by slice and written, without MindSpore: the file is a protobuf ``Checkpoint``
message (``mindspore/ccsrc/utils/checkpoint.proto``) written as a run of ``value`` entries::

    message Checkpoint { repeated Value value = 1; }
    message Value { required string tag = 1; optional TensorProto tensor = 2; optional MapTensorProto maptensor = 3; }
    message TensorProto { repeated int64 dims = 1; required string tensor_type = 2; required bytes tensor_content = 3; }

``mindspore.save_checkpoint`` writes one ``value`` per parameter, and splits a tensor over 512 MiB into several
``value`` entries with the same tag (``np.array_split`` along dim 0, so the contents join in row-major order);
with ``crc_check`` it appends ``b"crc_num"`` and 10 bytes. The reader walks the entries once, recording where
each tensor's bytes lie (one or more segments), and reads the rows a slice covers straight from the file, like
the safetensors reader (``models/hf/folder.py``). An encrypted or otherwise unparsable file is a named error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import BinaryIO, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..hf.folder import FolderError, TensorInfo, numpy_dtype

# MindSpore's tensor_type strings <-> safetensors dtype codes (the codes models/hf/folder.py reads)
MS_TYPES = {"Float32": "F32", "Float16": "F16", "BFloat16": "BF16", "Float64": "F64", "Int64": "I64",
            "Int32": "I32", "Int16": "I16", "Int8": "I8", "UInt8": "U8", "Bool": "BOOL"}
CODE_TO_MS = {v: k for k, v in MS_TYPES.items()}
SLICE_BYTES = 512 * 1024 * 1024          # mindspore.save_checkpoint's SLICE_SIZE (512 * 1024 KB)
CRC_TRAILER = b"crc_num"


@dataclass
class CkptTensorInfo(TensorInfo):
    """A tensor of a ``.ckpt`` file: its bytes in ``segments`` [(file offset, bytes)], in order."""
    segments: List[Tuple[int, int]] = field(default_factory=list)


def _varint(f: BinaryIO, where: str) -> int:
    shift = result = 0
    while True:
        b = f.read(1)
        if not b:
            raise EOFError(where)
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise _bad(where, f"byte {f.tell()}: a varint longer than 10 bytes")


def _bad(path: str, what: str) -> FolderError:
    return FolderError(f"MindSpore checkpoint {path}: {what} (not a MindSpore .ckpt file, or encrypted: "
                       "save it without enc_key)")


def _tensor(f: BinaryIO, end: int, path: str, tag: str) -> Tuple[List[int], Optional[str], int, int]:
    """(dims, tensor_type, content offset, content bytes) of a TensorProto ending at ``end``."""
    dims: List[int] = []
    ttype, offset, size = None, -1, 0
    while f.tell() < end:
        key = _varint(f, path)
        number, wire = key >> 3, key & 7
        if number == 1 and wire == 0:
            dims.append(_varint(f, path))
        elif number == 1 and wire == 2:                     # packed dims
            stop = _varint(f, path) + f.tell()
            while f.tell() < stop:
                dims.append(_varint(f, path))
        elif wire == 2:
            n = _varint(f, path)
            if number == 2:
                ttype = f.read(n).decode("utf-8", "replace")
            elif number == 3:
                offset, size = f.tell(), n
                f.seek(n, os.SEEK_CUR)
            else:
                f.seek(n, os.SEEK_CUR)
        elif wire == 0:
            _varint(f, path)
        else:
            raise _bad(path, f"tensor {tag!r}: protobuf wire type {wire}")
    return dims, ttype, offset, size


def read_ckpt_index(path: str) -> Dict[str, CkptTensorInfo]:
    """Every numeric tensor of a ``.ckpt`` file: name -> :class:`CkptTensorInfo` (the file is walked once; no
    tensor data is read). Map tensors and strings are skipped. :class:`FolderError` names a malformed file."""
    size = os.path.getsize(path)
    out: Dict[str, CkptTensorInfo] = {}
    with open(path, "rb") as f:
        while f.tell() < size:
            start = f.tell()
            if size - start == len(CRC_TRAILER) + 10 and f.read(len(CRC_TRAILER)) == CRC_TRAILER:
                break
            f.seek(start)
            try:
                key = _varint(f, path)
                if key != (1 << 3 | 2):
                    raise _bad(path, f"byte {start}: expected a checkpoint value entry, found field key {key}")
                end = _varint(f, path) + f.tell()
                if end > size:
                    raise _bad(path, f"byte {start}: an entry of {end - start} bytes runs past the end of the file "
                                     f"({size} bytes): truncated")
                tag, info = None, None
                while f.tell() < end:
                    k = _varint(f, path)
                    number, wire = k >> 3, k & 7
                    if wire != 2:
                        raise _bad(path, f"byte {f.tell()}: protobuf wire type {wire} in a value entry")
                    n = _varint(f, path)
                    if number == 1:
                        tag = f.read(n).decode("utf-8", "replace")
                    elif number == 2:
                        info = _tensor(f, f.tell() + n, path, tag or "?")
                    else:                                     # a map tensor: not a weight
                        f.seek(n, os.SEEK_CUR)
                f.seek(end)
            except EOFError:
                raise _bad(path, f"byte {start}: the file ends inside an entry (truncated)") from None
            except UnicodeDecodeError:
                raise _bad(path, f"byte {start}: a tensor name that is not UTF-8") from None
            if tag is None or info is None:
                continue
            dims, ttype, offset, nbytes = info
            if ttype not in MS_TYPES:        # strings ("str") and types we do not read
                continue
            code = MS_TYPES[ttype]
            entry = out.get(tag)
            if entry is None:
                out[tag] = CkptTensorInfo(tag, path, code, tuple(int(d) for d in dims), offset, [(offset, nbytes)])
            else:                                            # the next piece of a tensor split over 512 MiB
                entry.segments.append((offset, nbytes))
    for name, info in out.items():
        want = int(np.prod(info.shape, dtype=np.int64)) * numpy_dtype(info.dtype).itemsize
        have = sum(n for _, n in info.segments)
        if want != have:
            raise _bad(path, f"tensor {name!r} of {CODE_TO_MS[info.dtype]}{list(info.shape)} has {have} bytes, "
                             f"its shape needs {want}")
        if len(info.segments) > 1:
            info.offset = -1                 # read through the segments
    return out


def read_ckpt_slice(fd: int, info: CkptTensorInfo, slices=None) -> np.ndarray:
    """``slices`` (or all) of a ``.ckpt`` tensor: the dim-0 rows the slices cover, read from its segments."""
    from ..hf.folder import _pread_into, read_slice
    if len(info.segments) == 1:
        return read_slice(fd, info, slices)
    dtype, shape = numpy_dtype(info.dtype), tuple(info.shape)
    slices = tuple(slices) if slices is not None else ()
    slices = slices + (slice(None),) * (len(shape) - len(slices))
    start, stop, step = slices[0].indices(shape[0])
    if step != 1:
        raise ValueError(f"tensor {info.name!r}: only slices with step 1 are read")
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    lo, hi = start * row, max(stop, start) * row
    buffer = np.empty(hi - lo, np.uint8)
    done, pos = 0, 0
    for offset, n in info.segments:                 # the logical byte range [lo, hi) over the segments
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            _pread_into(fd, buffer[done:done + b - a], offset + a - pos, f"{info.file}: tensor {info.name!r}")
            done += b - a
        pos += n
    array = buffer.view(dtype).reshape((max(stop - start, 0),) + shape[1:])
    return array[(slice(None),) + slices[1:]]


# ------------------------------------------------------------------------------------------------ writing
def _key(number: int, wire: int) -> bytes:
    return _enc(number << 3 | wire)


def _enc(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _enc(len(payload)) + payload


def _type_of(array: np.ndarray) -> str:
    name = array.dtype.name
    codes = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64", "int32": "I32",
             "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
    if name not in codes:
        raise ValueError(f"write_ckpt: dtype {name} has no MindSpore checkpoint type")
    return CODE_TO_MS[codes[name]]


def write_ckpt(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``tensors`` as a MindSpore ``.ckpt`` file (``mindspore.load_checkpoint`` reads it): one value entry per
    tensor, split along dim 0 over 512 MiB as MindSpore does."""
    with open(path, "wb") as f:
        for name, array in tensors.items():
            array = np.ascontiguousarray(array)
            ttype = _type_of(array).encode()
            pieces = [array]
            if array.nbytes > SLICE_BYTES and array.ndim:
                pieces = np.array_split(array, int(np.ceil(array.nbytes / SLICE_BYTES)))
            for piece in pieces:
                dims = b"".join(_key(1, 0) + _enc(int(d)) for d in array.shape)
                tensor = dims + _len_field(2, ttype) + _len_field(3, np.ascontiguousarray(piece).tobytes())
                value = _len_field(1, name.encode()) + _len_field(2, tensor)
                f.write(_len_field(1, value))
        f.flush()
        os.fsync(f.fileno())


__all__ = ["read_ckpt_index", "read_ckpt_slice", "write_ckpt", "CkptTensorInfo", "MS_TYPES"]
