"""Fine-tuning rows from tokenized documents: packing (``pack``, ``truncate``) or padding.

A *document* is one tokenized example with the batch convention of ``common/batch.py`` already applied:
``input_ids[t]`` predicts ``labels[t]`` (the next token), and ``loss_mask[t]`` is 1 where ``labels[t]`` is a
target (a response token), 0 for prompt tokens. A document of ``n`` tokens is ``n - 1`` positions long.

Rows are dicts of equal-length int/float arrays (``input_ids``, ``labels``, ``loss_mask``, ``position_ids``,
``segment_ids``), ``seq_length`` long:

* ``pack``: documents in their order are put into a row while they fit (MindFormers' ``PackingHandler``
  ``pack_strategy: pack``); a document longer than a row is cut to ``seq_length``; the rest of a row is
  padding. Position ids restart at 0 at every document, segment ids number the documents of a row
  (0, 1, ...), so the model's ``AttentionMask`` keeps documents from seeing each other.
* ``truncate``: documents are concatenated and the stream is cut into rows of ``seq_length`` (no padding;
  a document may continue in the next row, where its positions continue; the last incomplete row is
  dropped).
* padding (packing off): one document per row, cut to ``seq_length``, padded at the end.

Padding tokens are ``pad_id`` in ``input_ids`` and ``labels``, ``loss_mask`` 0, their own segment id, and
positions continuing the last document's (the attention mask is causal by position: padding numbered from 0
would sit "before" the real tokens of a row fed without segment ids and be seen by them). No real token
attends to padding, and no loss is taken on it.
"""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Optional

import numpy as np

Document = Dict[str, np.ndarray]
Row = Dict[str, np.ndarray]
PACK_STRATEGIES = ("pack", "truncate")


def make_document(prompt_ids: List[int], response_ids: List[int]) -> Document:
    """The document of ``prompt + response`` tokens whose loss covers only the response's tokens."""
    tokens = np.asarray(list(prompt_ids) + list(response_ids), dtype=np.int64)
    target = np.asarray([0] * len(prompt_ids) + [1] * len(response_ids), dtype=np.float32)
    return {"input_ids": tokens[:-1], "labels": tokens[1:], "loss_mask": target[1:]}


def _cut(doc: Document, n: int) -> Document:
    return {k: v[:n] for k, v in doc.items()}


def _row(pieces: List[Document], seq_length: int, pad_id: int, positions: Optional[List[np.ndarray]] = None) -> Row:
    used = sum(len(p["input_ids"]) for p in pieces)
    pad = seq_length - used
    ids = [p["input_ids"] for p in pieces] + [np.full(pad, pad_id, np.int64)]
    row = {"input_ids": np.concatenate(ids).astype(np.int32),
           "labels": np.concatenate([p["labels"] for p in pieces] + [np.full(pad, pad_id, np.int64)]).astype(np.int32),
           "loss_mask": np.concatenate([p["loss_mask"] for p in pieces] + [np.zeros(pad, np.float32)]).astype(np.float32)}
    pos = positions or [np.arange(len(p["input_ids"])) for p in pieces]
    after = int(pos[-1][-1]) + 1 if pos and len(pos[-1]) else 0     # padding continues the last document's positions:
    row["position_ids"] = np.concatenate(list(pos) + [np.arange(after, after + pad)]).astype(np.int32)
    row["segment_ids"] = np.concatenate([np.full(len(p["input_ids"]), i) for i, p in enumerate(pieces)]
                                        + [np.full(pad, len(pieces))]).astype(np.int32)
    return row


def pad_rows(docs: Iterable[Document], seq_length: int, pad_id: int) -> Iterator[Row]:
    """Packing off: one document per row, cut to ``seq_length``, padded at the end."""
    for doc in docs:
        yield _row([_cut(doc, seq_length)], seq_length, pad_id)


def pack_rows(docs: Iterable[Document], seq_length: int, pad_id: int, max_documents: Optional[int] = None
              ) -> Iterator[Row]:
    """``pack``: documents in order, as many as fit into a row of ``seq_length`` (each cut to the row's
    length if longer), the rest padding. ``max_documents`` caps the documents of one row (MindFormers'
    ``compressed_eod_mask_length``: the length of the compressed end-of-document list)."""
    row: List[Document] = []
    used = 0
    for doc in docs:
        doc = _cut(doc, seq_length)
        n = len(doc["input_ids"])
        if n == 0:
            continue
        if row and (used + n > seq_length or (max_documents is not None and len(row) >= max_documents)):
            yield _row(row, seq_length, pad_id)
            row, used = [], 0
        row.append(doc)
        used += n
    if row:
        yield _row(row, seq_length, pad_id)


def truncate_rows(docs: Iterable[Document], seq_length: int, pad_id: int) -> Iterator[Row]:
    """``truncate``: the documents' stream cut into full rows; a document cut at a row's end continues in
    the next row with its positions continuing; the last incomplete row is dropped."""
    row: List[Document] = []
    pos: List[np.ndarray] = []
    used = 0
    for doc in docs:
        start = 0
        n = len(doc["input_ids"])
        while start < n:
            take = min(n - start, seq_length - used)
            row.append({k: v[start:start + take] for k, v in doc.items()})
            pos.append(np.arange(start, start + take))
            used += take
            start += take
            if used == seq_length:
                yield _row(row, seq_length, pad_id, pos)
                row, pos, used = [], [], 0


def build_rows(docs: Iterable[Document], seq_length: int, pad_id: int, strategy: Optional[str] = None,
               max_documents: Optional[int] = None) -> List[Row]:
    """Rows of ``seq_length`` tokens: ``strategy`` ``pack`` / ``truncate``, or None for padding."""
    if strategy is None:
        return list(pad_rows(docs, seq_length, pad_id))
    if strategy == "pack":
        return list(pack_rows(docs, seq_length, pad_id, max_documents))
    if strategy == "truncate":
        return list(truncate_rows(docs, seq_length, pad_id))
    raise ValueError(f"pack_strategy = {strategy!r}: must be one of {list(PACK_STRATEGIES)}")
