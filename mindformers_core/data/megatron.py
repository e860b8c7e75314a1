"""Megatron-style indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``), as MindFormers'
``BlendedMegatronDatasetDataLoader`` and Megatron-LM's ``IndexedDataset`` read them.

The format (little-endian), as Megatron-LM's ``megatron/core/datasets/indexed_dataset.py`` defines it
(read there, written here from the description):

- ``.bin``: every sequence's token ids back to back, in the index's dtype, no header;
- ``.idx``: the 9 magic bytes ``MMIDIDX\\x00\\x00``, version ``uint64`` = 1, dtype code ``uint8``
  (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), sequence count
  ``uint64``, document-index count ``uint64``, then ``int32[sequences]`` lengths, ``int64[sequences]``
  byte offsets into ``.bin``, ``int64[documents + 1]`` document boundaries (sequence indices, from 0 to
  the sequence count), and for multimodal data ``int8[sequences]`` modes (ignored here).

:func:`write_indexed_dataset` writes one sequence per document (what Megatron's preprocess_data.py
writes without sentence splitting); :class:`IndexedDataset` maps both files read-only.
:class:`MegatronDataset` serves packed ``(input_ids, labels)`` samples from one or more prefixes with
blend weights (``data_path: [w1, prefix1, w2, prefix2, ...]``): each prefix's documents are joined in
file order into one token stream cut into the windows :class:`~.dataset.PackedDataset` cuts
(``seq_length + 1`` tokens, overlapping by one), and samples of several prefixes are interleaved in
proportion to the weights. Order, data-parallel split and resume are ``PackedDataset``'s.
"""
from __future__ import annotations

import os
import struct
from typing import Iterable, List, Sequence, Tuple, Union

import numpy as np

from .dataset import SampleOrder

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8


def token_dtype(vocab_size: int):
    """The smallest dtype Megatron's tools pick for a vocabulary: uint16 below 65500 ids, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


def write_indexed_dataset(prefix: str, documents: Iterable[Sequence[int]], dtype=np.uint16) -> Tuple[int, int]:
    """Write ``prefix.bin`` and ``prefix.idx``, one sequence per document; returns (documents, tokens).
    Both files are written under temporary names and renamed, the ``.idx`` last."""
    dtype = np.dtype(dtype)
    if dtype not in CODES:
        raise ValueError(f"write_indexed_dataset: dtype={dtype} is not one of {sorted(str(d) for d in CODES)}")
    lengths: List[int] = []
    tmp_bin, tmp_idx = f"{prefix}.bin.tmp{os.getpid()}", f"{prefix}.idx.tmp{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    try:
        with open(tmp_bin, "wb") as out:
            for doc in documents:
                arr = np.asarray(doc)
                if arr.size and (arr.min() < 0 or (dtype.kind in "iu" and arr.max() > np.iinfo(dtype).max)):
                    raise ValueError(f"write_indexed_dataset: token ids {arr.min()}..{arr.max()} do not fit {dtype}")
                out.write(arr.astype(dtype).tobytes())
                lengths.append(int(arr.size))
        sizes = np.asarray(lengths, np.int32)
        pointers = np.zeros(len(lengths), np.int64)
        if len(lengths) > 1:
            pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * dtype.itemsize
        doc_index = np.arange(len(lengths) + 1, dtype=np.int64)
        with open(tmp_idx, "wb") as out:
            out.write(MAGIC)
            out.write(struct.pack("<Q", VERSION))
            out.write(struct.pack("<B", CODES[dtype]))
            out.write(struct.pack("<Q", len(lengths)))
            out.write(struct.pack("<Q", len(doc_index)))
            out.write(sizes.astype("<i4").tobytes())
            out.write(pointers.astype("<i8").tobytes())
            out.write(doc_index.astype("<i8").tobytes())
        os.replace(tmp_bin, prefix + ".bin")
        os.replace(tmp_idx, prefix + ".idx")
    finally:
        for leftover in (tmp_bin, tmp_idx):
            if os.path.exists(leftover):
                os.remove(leftover)
    return len(lengths), int(sum(lengths))


class IndexedDataset:
    """``<prefix>.bin``/``.idx`` memory-mapped: ``len(ds)`` sequences, ``ds[i]`` the i-th one's token ids,
    ``document_indices`` the sequence range of each document, ``tokens`` the whole ``.bin``.
    Raises ValueError naming the file for anything that is not a valid index."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        idx, bin_ = prefix + ".idx", prefix + ".bin"
        for path in (idx, bin_):
            if not os.path.isfile(path):
                raise ValueError(f"{path}: no such file (a Megatron dataset prefix names <prefix>.bin and "
                                 "<prefix>.idx; write them with scripts/preprocess_megatron.py)")
        with open(idx, "rb") as f:
            head = f.read(_HEADER)
        if len(head) < _HEADER or head[:len(MAGIC)] != MAGIC:
            raise ValueError(f"{idx}: not a Megatron index file (no {MAGIC!r} header)")
        version, code, count, doc_count = struct.unpack("<QBQQ", head[len(MAGIC):])
        if version != VERSION:
            raise ValueError(f"{idx}: index version {version}, only version {VERSION} is known")
        if code not in DTYPES:
            raise ValueError(f"{idx}: unknown dtype code {code} (known: {sorted(DTYPES)})")
        self.dtype = np.dtype(DTYPES[code])
        size = os.path.getsize(idx)
        need = _HEADER + count * 4 + count * 8 + doc_count * 8
        if size < need:
            raise ValueError(f"{idx}: truncated ({size} bytes, the header promises {need})")
        self.sequence_lengths = np.memmap(idx, "<i4", "r", _HEADER, (count,)) if count else np.zeros(0, np.int32)
        self.sequence_pointers = np.memmap(idx, "<i8", "r", _HEADER + 4 * count, (count,)) if count \
            else np.zeros(0, np.int64)
        self.document_indices = np.memmap(idx, "<i8", "r", _HEADER + 12 * count, (doc_count,))
        bin_size = os.path.getsize(bin_)
        self.num_tokens = bin_size // self.dtype.itemsize
        if count and int(self.sequence_pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize > bin_size:
            raise ValueError(f"{bin_}: shorter ({bin_size} bytes) than its index {idx} says")
        self.tokens = np.memmap(bin_, self.dtype, "r") if bin_size else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return np.asarray(self.tokens[start:start + int(self.sequence_lengths[i])])

    def stream(self) -> np.ndarray:
        """All sequences in document order, joined (the ``.bin`` itself when written contiguously)."""
        contiguous = len(self) == 0 or (int(self.sequence_pointers[0]) == 0 and np.all(
            np.diff(np.asarray(self.sequence_pointers)) == np.asarray(self.sequence_lengths[:-1], np.int64)
            * self.dtype.itemsize))
        if contiguous:
            return self.tokens[:int(np.sum(self.sequence_lengths, dtype=np.int64))]
        return np.concatenate([self[i] for i in range(len(self))]) if len(self) else self.tokens[:0]


def parse_data_path(value: Union[str, Sequence]) -> List[Tuple[float, str]]:
    """MindFormers'/Megatron's ``data_path``: one prefix, ``[prefix, ...]`` (equal weights) or
    ``[weight, prefix, weight, prefix, ...]``. Returns ``[(weight, prefix)]``; ValueError says what is wrong."""
    items = [value] if isinstance(value, str) else list(value or [])
    if not items:
        raise ValueError("empty: give a prefix of <prefix>.bin/.idx files, or [weight, prefix, ...]")

    def number(x):
        try:
            return float(x)
        except (TypeError, ValueError):
            return None

    if len(items) % 2 == 0 and all(number(w) is not None for w in items[0::2]) and \
            all(number(p) is None for p in items[1::2]):
        pairs = [(number(w), str(p)) for w, p in zip(items[0::2], items[1::2])]
    elif all(number(p) is None for p in items):
        pairs = [(1.0, str(p)) for p in items]
    else:
        raise ValueError("must be a prefix, a list of prefixes, or [weight, prefix, weight, prefix, ...]")
    if any(w <= 0 for w, _ in pairs):
        raise ValueError(f"weights must be > 0, got {[w for w, _ in pairs]}")
    return pairs


def blend_indices(weights: Sequence[float], sizes: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """(dataset, sample) of each blended sample: ``sum(sizes)`` samples, each next one from the dataset
    furthest behind its weighted share (Megatron's greedy rule); a dataset past its end wraps around."""
    w = np.asarray(weights, np.float64) / float(np.sum(weights))
    total = int(np.sum(sizes))
    which, index = np.zeros(total, np.int64), np.zeros(total, np.int64)
    taken = np.zeros(len(w), np.int64)
    for i in range(total):
        d = int(np.argmax(w * (i + 1) - taken))
        which[i], index[i] = d, taken[d] % sizes[d]
        taken[d] += 1
    return which, index


class MegatronDataset(SampleOrder):
    """Packed ``(input_ids, labels)`` samples of one data-parallel rank from Megatron ``.bin/.idx``
    prefixes (see the module docstring). ``data_path`` as :func:`parse_data_path` reads it."""

    def __init__(self, data_path, seq_length, seed=0, shuffle=True, dp_rank=0, dp_size=1, drop_remainder=True,
                 vocab_size=None):
        if seq_length < 1:
            raise ValueError(f"seq_length must be >= 1, got {seq_length}")
        self.pairs = parse_data_path(data_path)
        self.sources = [IndexedDataset(os.path.abspath(p)) for _, p in self.pairs]
        self.streams, sizes = [], []
        for (_, prefix), src in zip(self.pairs, self.sources):
            stream = src.stream()
            if src.dtype.kind == "f":
                raise ValueError(f"{prefix}.idx: float tokens ({src.dtype}); token ids must be integers")
            if vocab_size is not None and len(stream) and int(stream.max()) >= vocab_size:
                raise ValueError(f"{prefix}.bin: token id {int(stream.max())} >= vocab_size {vocab_size}; "
                                 "written with another tokenizer?")
            n = max(len(stream) - 1, 0) // seq_length
            if n == 0:
                raise ValueError(f"{prefix}: {len(stream)} tokens, a sample needs seq_length + 1 = {seq_length + 1}")
            self.streams.append(stream)
            sizes.append(n)
        self.sizes = sizes
        self.which, self.index = blend_indices([w for w, _ in self.pairs], sizes)
        self._init_order(len(self.which), seq_length, seed, shuffle, dp_rank, dp_size, drop_remainder)

    def sample(self, index):
        d, j = int(self.which[index]), int(self.index[index])
        start = j * self.seq_length
        window = np.asarray(self.streams[d][start:start + self.seq_length + 1], dtype=np.int32)
        return window[:-1], window[1:]
