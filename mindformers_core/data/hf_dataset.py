"""MindFormers' ``HFDataLoader`` on local data: the ``datasets`` library reads the files, the handler chain
(``data/handlers.py``) tokenizes records into documents, ``data/packing.py`` makes rows, and
:class:`SFTDataset` hands this data-parallel rank its rows as batch dicts (``common/batch.py``).

Sources (``path``, with ``load_func``):

* a file ``.json`` / ``.jsonl`` / ``.parquet`` / ``.csv`` / ``.arrow``, or a folder of such files
  (``load_func: load_dataset``, the default); JSON files are checked line by line first, so a broken line is
  named by file and line number;
* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_func: load_from_disk``,
  or recognized by its ``state.json`` / ``dataset_dict.json``);
* a builder name (``json``, ``parquet``, ``csv``, ``arrow``) with ``data_files``.

Nothing is downloaded: a Hugging Face hub name that is not a local path is an error naming the path tried
(download the data set first, e.g. ``huggingface-cli download NAME --repo-type dataset --local-dir DIR``).
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .dataset import SampleOrder
from .handlers import Chain, apply_column_ops, check_columns, fitted_documents, parse_handlers
from .packing import Document, Row, build_rows

BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
LOAD_FUNCS = ("load_dataset", "load_from_disk")
ROW_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids")
# MindFormers' names of the packed-document mask columns: fed here as segment_ids (the model's AttentionMask)
MASK_COLUMNS = ("attention_mask", "actual_seq_len")


def _datasets():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")        # local data only: never reach for the hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise ValueError("HFDataLoader reads data with the Hugging Face 'datasets' library: pip install "
                         "datasets") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def check_json_file(path: str) -> None:
    """``ValueError`` naming ``path`` and the line of the first broken record: a JSON file holds one JSON
    document (a list of records) or JSON lines (one record per line)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if not stripped:
        raise ValueError(f"{path}: empty file, no records")
    if stripped[0] == "[":
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
        return
    for lineno, record in json_lines(path, text):
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno}: a record must be a JSON object, got {type(record).__name__}")


def json_lines(path: str, text: Optional[str] = None) -> List[Tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSON-lines file (``text``: its content, when read
    already); ``ValueError`` naming ``path`` and the line of the first that is not JSON."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    return out


def _files_of(folder: str) -> List[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
                  if os.path.isfile(p) and os.path.splitext(p)[1] in BUILDERS)


def load_hf_dataset(path: Optional[str], load_func: str = "load_dataset", split: Optional[str] = "train",
                    data_files: Any = None, cache_dir: Optional[str] = None, name: str = "path"):
    """A ``datasets.Dataset`` of local data (see the module docstring); ``ValueError`` naming ``name``, the
    path tried and what would be valid."""
    if load_func not in LOAD_FUNCS:
        raise ValueError(f"load_func = {load_func!r}: must be one of {list(LOAD_FUNCS)} (local data)")
    if path in (None, "") and data_files in (None, "", []):
        raise ValueError(f"{name} is not set: give a local data file or folder")
    datasets = _datasets()
    if path in BUILDERS.values() and data_files not in (None, "", []):
        builder, files = path, [data_files] if isinstance(data_files, str) else list(data_files)
    else:
        target = os.path.abspath(os.path.expanduser(str(path)))
        if not os.path.exists(target):
            raise ValueError(f"{name} = {path!r}: no such local file or folder (tried {target}); data sets are not "
                             "downloaded here: download it first (e.g. huggingface-cli download NAME --repo-type "
                             "dataset --local-dir DIR) and give that path")
        saved = os.path.isdir(target) and any(os.path.isfile(os.path.join(target, f))
                                              for f in ("state.json", "dataset_dict.json"))
        if load_func == "load_from_disk" or saved:
            if not saved:
                raise ValueError(f"{name} = {path!r}: load_func load_from_disk needs a folder written by "
                                 f"save_to_disk (with state.json or dataset_dict.json); {target} is not one")
            ds = datasets.load_from_disk(target)
            return _split(ds, split, name, target)
        files = _files_of(target) if os.path.isdir(target) else [target]
        if not files:
            raise ValueError(f"{name} = {path!r}: {target} holds no {'/'.join(BUILDERS)} files")
        kinds = {BUILDERS.get(os.path.splitext(f)[1]) for f in files}
        if None in kinds or len(kinds) != 1:
            raise ValueError(f"{name} = {path!r}: files must all be one of {'/'.join(BUILDERS)}; got "
                             f"{sorted({os.path.splitext(f)[1] for f in files})}")
        builder = kinds.pop()
    files = [os.path.abspath(f) for f in files]
    for f in files:
        if not os.path.isfile(f):
            raise ValueError(f"{name}: data file {f} does not exist")
        if builder == "json":
            check_json_file(f)
    try:
        ds = datasets.load_dataset(builder, data_files={"train": files}, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - datasets wraps reader errors in several classes
        raise ValueError(f"{name} = {path!r}: datasets could not read {files if len(files) > 1 else files[0]} "
                         f"as {builder}: {type(e).__name__}: {e}") from None
    return _split(ds, split, name, files[0])


def _split(ds, split: Optional[str], name: str, where: str):
    datasets = _datasets()
    if isinstance(ds, datasets.DatasetDict):
        base = (split or "train").split("[")[0]
        if base not in ds:
            raise ValueError(f"split = {split!r}: {where} has splits {list(ds)}")
        if split and "[" in split:
            return datasets.concatenate_datasets([ds[base]]).select(_slice_rows(split, len(ds[base])))
        return ds[base]
    return ds


def _slice_rows(split: str, n: int) -> range:
    """``train[:10]``, ``train[10:20]``, ``train[:50%]`` -> the row range."""
    inner = split[split.index("[") + 1:split.rindex("]")]
    a, _, b = inner.partition(":")

    def at(v, default):
        v = v.strip()
        if not v:
            return default
        return int(round(float(v[:-1]) * n / 100)) if v.endswith("%") else int(v)
    return range(max(0, at(a, 0)), min(n, at(b, n)))


class NoTargetTokens(ValueError):
    """No record of the data set keeps a target token within the rows' budget: nothing to fine-tune on."""


NO_TARGET = "no target token within seq_length {budget}"
TOO_LONG = "longer than PackingHandler seq_length {limit} (MindFormers' pack skips such records)"


@dataclass
class SFTRows:
    """The rows of a data set and what became of its records: how many there were, how many were cut to fit
    the budget (each keeping a target token) and which were dropped, by reason (record numbers after the
    column handlers, 0-based)."""
    rows: List[Row]
    source: str
    records: int
    budget: int
    cut: int = 0
    dropped: Dict[str, List[int]] = field(default_factory=dict)

    @property
    def dropped_count(self) -> int:
        return sum(len(v) for v in self.dropped.values())

    def lines(self) -> List[str]:
        """The start-up report: one line for the cut records, one per reason records were dropped."""
        out = []
        if self.cut:
            out.append(f"{self.source}: {self.cut} of {self.records} records cut to seq_length {self.budget} "
                       "(prompt and earlier turns first; each keeps its response's first tokens)")
        for reason, numbers in self.dropped.items():
            shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
            out.append(f"{self.source}: {len(numbers)} of {self.records} records dropped: {reason} "
                       f"(records {shown})")
        return out


def fit_records(ds, handlers: Any, tokenizer, seq_length: int, where: str = "train_dataset.data_loader.handler",
                source: str = "the dataset") -> Tuple[List[Document], "SFTRows"]:
    """``ds`` through the column handlers and the tokenizing handler, each record fitted into the budget
    (``Chain.budget``: ``seq_length`` or the tokenizing handler's shorter one; ``data/truncation.py``), records
    without a target token (or, with ``pack``, longer than PackingHandler's ``seq_length``) dropped and counted.
    ``NoTargetTokens`` when no record is left."""
    chain: Chain = handlers if isinstance(handlers, Chain) else parse_handlers(handlers, where)
    ds = apply_column_ops(ds, chain.column_ops, where)
    check_columns(ds.column_names, chain.tokenize, source)
    budget, limit = chain.budget(seq_length), chain.pack_limit(seq_length)
    fitted = fitted_documents(ds, tokenizer, chain.tokenize, where, budget + 1)   # n tokens fill n - 1 positions
    report = SFTRows([], source, len(fitted), budget)
    docs = []
    for n, (doc, cut) in enumerate(fitted):
        if not doc["loss_mask"].any():
            report.dropped.setdefault(NO_TARGET.format(budget=budget), []).append(n)
        elif limit is not None and len(doc["input_ids"]) > limit:
            report.dropped.setdefault(TOO_LONG.format(limit=limit), []).append(n)
        else:
            report.cut += cut
            docs.append(doc)
    if not docs:
        reasons = "; ".join(f"{len(v)} {k}" for k, v in report.dropped.items()) or "no records"
        raise NoTargetTokens(f"{source}: none of its {report.records} records keeps a target token ({reasons}); "
                             f"nothing to fine-tune on: give records with a response (output / an assistant turn), "
                             f"or a longer model.model_config.seq_length than {seq_length}")
    return docs, report


def sft_rows(ds, handlers: Any, tokenizer, seq_length: int, max_documents: Optional[int] = None,
             where: str = "train_dataset.data_loader.handler", source: str = "the dataset") -> SFTRows:
    """``ds`` through the handler chain: column handlers, the tokenizing handler (records fitted, dropped ones
    counted: :func:`fit_records`), packing or padding. Rows are ``seq_length`` tokens."""
    chain: Chain = handlers if isinstance(handlers, Chain) else parse_handlers(handlers, where)
    docs, report = fit_records(ds, chain, tokenizer, seq_length, where, source)
    report.rows = build_rows(docs, seq_length, int(tokenizer.pad_token_id), chain.pack_strategy, max_documents)
    return report


def build_sft_rows(ds, handlers: Any, tokenizer, seq_length: int, max_documents: Optional[int] = None,
                   where: str = "train_dataset.data_loader.handler", source: str = "the dataset") -> List[Row]:
    """The rows of :func:`sft_rows`."""
    return sft_rows(ds, handlers, tokenizer, seq_length, max_documents, where, source).rows


def feed_keys(input_columns: Optional[Sequence[str]], packed: bool) -> List[str]:
    """Batch keys fed to the model: those of ``input_columns`` (``attention_mask`` / ``actual_seq_len`` read
    as segment ids), ``segment_ids`` always when packing (documents must not see each other)."""
    if input_columns is None:
        keys = list(ROW_KEYS)
    else:
        unknown = [c for c in input_columns if c not in ROW_KEYS and c not in MASK_COLUMNS]
        if unknown or "input_ids" not in input_columns:
            raise ValueError(f"input_columns = {list(input_columns)}: must hold 'input_ids' and only "
                             f"{list(ROW_KEYS) + list(MASK_COLUMNS)}; unknown {unknown}")
        keys = [k for k in ROW_KEYS if k in input_columns]
        if any(c in input_columns for c in MASK_COLUMNS) and "segment_ids" not in keys:
            keys.append("segment_ids")
        if "labels" not in keys:
            keys.insert(1, "labels")                     # training needs the targets
    if packed and "segment_ids" not in keys:
        keys.append("segment_ids")
    if not packed and "segment_ids" in keys:
        keys.remove("segment_ids")                       # one document per row: nothing to separate
    return [k for k in ROW_KEYS if k in keys]


class SFTDataset(SampleOrder):
    """This data-parallel rank's fine-tuning rows (dicts of batch keys), in the order and with the resume
    state of the pretraining datasets (``data/dataset.py``: ``consumed_samples``, ``state_dict``)."""

    def __init__(self, rows: List[Row], keys: Sequence[str] = ROW_KEYS, seed: int = 0, shuffle: bool = True,
                 dp_rank: int = 0, dp_size: int = 1, drop_remainder: bool = True):
        if not rows:
            raise ValueError("the handler chain produced no rows")
        self.rows = rows
        self.keys = list(keys)
        self._init_order(len(rows), len(rows[0]["input_ids"]), seed, shuffle, dp_rank, dp_size, drop_remainder)
        self._orders: Dict[int, np.ndarray] = {}

    def global_targets(self, start: int, count: int) -> float:
        """Target tokens (``loss_mask`` sums) of the samples at positions ``start .. start + count - 1`` of this
        rank's stream, summed over every data-parallel rank: each rank reads the same positions of its own
        share, so every rank computes the same number without communication (the global batch's count)."""
        n, dp = self.num_samples, self.dp_size
        total = 0.0
        for p in range(start, start + count):
            for rank in range(dp):
                per_epoch = n // dp if self.drop_remainder else len(range(rank, n, dp))
                epoch, pos = divmod(p, per_epoch)
                if epoch not in self._orders:
                    self._orders = {epoch: (np.random.default_rng([self.seed, epoch]).permutation(n)
                                            if self.shuffle else np.arange(n))}
                index = int(self._orders[epoch][rank::dp][pos])
                total += float(self.rows[index]["loss_mask"].sum())
        return total

    def sample(self, index: int) -> Dict[str, np.ndarray]:
        row = self.rows[index]
        return {k: row[k] for k in self.keys}

    def target_tokens(self) -> int:
        return int(sum(float(r["loss_mask"].sum()) for r in self.rows))


def hf_sft_dataset(path, handlers, tokenizer, seq_length: int, load_func: str = "load_dataset",
                   split: Optional[str] = "train", data_files: Any = None, input_columns=None,
                   max_documents: Optional[int] = None, cache_dir: Optional[str] = None, seed: int = 0,
                   shuffle: bool = False, dp_rank: int = 0, dp_size: int = 1) -> SFTDataset:
    """The whole pipeline in one call: local data -> handler chain -> rows -> this rank's SFTDataset."""
    chain = parse_handlers(handlers)
    ds = load_hf_dataset(path, load_func, split, data_files, cache_dir)
    rows = build_sft_rows(ds, chain, tokenizer, seq_length, max_documents, source=f"{path}")
    keys = feed_keys(input_columns, chain.pack_strategy is not None)
    return SFTDataset(rows, keys, seed=seed, shuffle=shuffle, dp_rank=dp_rank, dp_size=dp_size)
