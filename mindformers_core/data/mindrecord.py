"""Preprocessed pretraining data in MindSpore's MindRecord format.

``write_mindrecord`` tokenizes text/JSONL once and stores the packed windows (``seq_length + 1``
tokens each, the same windows :class:`~.dataset.PackedDataset` cuts) as rows of one int32 column
``input_ids``. ``MindRecordDataset`` reads them back through ``mindspore.dataset.MindDataset`` and
serves them in the same deterministic, resumable order as ``PackedDataset`` (same seed, same
permutation, same data-parallel split), so a run on MindRecord data gives the losses of a run on
the text it was made from.

Writing is atomic: the files are written in a temporary directory next to the target and moved
into place, the ``.mindrecord`` file last (its presence means the pair is complete).
"""
import os
import shutil

import numpy as np

from .dataset import SampleOrder, tokenize_to_cache
from .tokenizer import as_tokenizer, check_files

COLUMN = "input_ids"


def write_mindrecord(data_files, tokenizer, seq_length, output, text_key="text", cache_dir=None):
    """Tokenize ``data_files`` and write their packed ``seq_length + 1``-token windows to ``output``
    (a ``.mindrecord`` path; MindSpore adds ``output + ".db"``). Returns the number of rows."""
    from mindspore.mindrecord import FileWriter
    files = check_files(data_files, "data_files")
    if not str(output).endswith(".mindrecord"):
        raise ValueError(f"write_mindrecord: output={output!r} must end with .mindrecord")
    if seq_length < 1:
        raise ValueError(f"write_mindrecord: seq_length={seq_length} must be >= 1")
    tokenizer = as_tokenizer(tokenizer)
    output = os.path.abspath(output)
    cache = tokenize_to_cache(files, tokenizer, cache_dir or os.path.join(os.path.dirname(output), ".token_cache"),
                              text_key)
    tokens = np.load(cache, mmap_mode="r")
    rows = max(len(tokens) - 1, 0) // seq_length
    if rows == 0:
        raise ValueError(f"write_mindrecord: seq_length={seq_length} too large: a row needs {seq_length + 1} tokens "
                         f"but {files} give only {len(tokens)}")
    tmp_dir = f"{output}.tmp{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    try:
        tmp = os.path.join(tmp_dir, os.path.basename(output))
        writer = FileWriter(tmp, shard_num=1, overwrite=True)
        writer.set_header_size(1 << 16)    # MindSpore's defaults (16 MB header, 32 MB pages) pad a small
        writer.set_page_size(1 << 20)      # corpus to tens of MB
        writer.add_schema({COLUMN: {"type": "int32", "shape": [-1]}}, f"packed windows of {seq_length + 1} tokens")
        for lo in range(0, rows, 1024):
            batch = [{COLUMN: np.asarray(tokens[i * seq_length:i * seq_length + seq_length + 1], np.int32)}
                     for i in range(lo, min(rows, lo + 1024))]
            writer.write_raw_data(batch)
        writer.commit()
        os.replace(tmp + ".db", output + ".db")
        os.replace(tmp, output)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return rows


def mindrecord_files(path):
    """The ``.mindrecord`` files ``path`` names: itself, or the ones in a directory, sorted."""
    if os.path.isdir(path):
        found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".mindrecord"))
        if not found:
            raise FileNotFoundError(f"{path}: directory holds no .mindrecord files (write them with "
                                    "scripts/preprocess_mindrecord.py)")
        return found
    if not os.path.isfile(path) or not path.endswith(".mindrecord"):
        raise FileNotFoundError(f"{path}: not a .mindrecord file or a directory of them")
    return [path]


class MindRecordDataset(SampleOrder):
    """``(input_ids, labels)`` samples of one data-parallel rank from MindRecord files written by
    :func:`write_mindrecord`. The rows are read once through ``mindspore.dataset.MindDataset``
    (in file order, unshuffled) and held in memory; the order and resume logic are
    ``PackedDataset``'s."""

    def __init__(self, path, seq_length, seed=0, shuffle=True, dp_rank=0, dp_size=1, drop_remainder=True):
        import mindspore.dataset as ds
        files = mindrecord_files(path)
        data = ds.MindDataset(files, columns_list=[COLUMN], shuffle=False, num_parallel_workers=1)
        rows = [row[0] for row in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
        if not rows:
            raise ValueError(f"{path}: the MindRecord files hold no rows")
        lengths = {len(r) for r in rows}
        if lengths != {seq_length + 1}:
            raise ValueError(f"{path}: rows hold {sorted(lengths)} tokens, but seq_length={seq_length} needs "
                             f"{seq_length + 1}; write the files again with --seq_length {seq_length}")
        self.rows = np.stack(rows).astype(np.int32)
        self.files = files
        self._init_order(len(rows), seq_length, seed, shuffle, dp_rank, dp_size, drop_remainder)

    def sample(self, index):
        window = self.rows[index]
        return window[:-1], window[1:]
