"""Pretraining data: text/JSONL → token ids (cached .npy) → packed fixed-length samples.

Why packing: pretraining wants every position of every sample to be a real token. Documents are encoded as
``BOS ids EOS``, concatenated into one token stream, and sample ``i`` is the window
``tokens[i*seq_length : i*seq_length + seq_length + 1]``; ``input_ids`` is its first ``seq_length`` tokens
and ``labels`` the last ``seq_length`` (shifted by one). Windows overlap by one token, so every token
except the first is a label exactly once; the stream's tail shorter than a window is dropped.

Order and ranks: each epoch draws a permutation of all samples from ``(seed, epoch)``; rank ``r`` of
``dp_size`` takes positions ``r, r + dp_size, ...`` of it. Ranks are therefore disjoint, and at step ``k``
the union of the ranks' batches is exactly what one process with ``batch_size * dp_size`` would see.

Resume: the position is one number, ``consumed_samples`` (per rank, over all epochs), so a checkpointed
``state_dict()`` restored with ``load_state_dict()`` continues with exactly the same samples.
"""
import hashlib
import json
import os

import numpy as np

from .tokenizer import as_tokenizer, check_files

_CHUNK_DOCS = 4096  # documents per sentencepiece call: large enough for speed, small enough for memory


def _is_jsonl(path):
    return path.endswith((".jsonl", ".json"))


def read_documents(path, text_key="text"):
    """Yield documents of one file: a JSONL file (``.jsonl``/``.json``) gives field ``text_key`` of each
    line; any other file is plain text with one document per non-empty line (the corpus format)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not _is_jsonl(path):
                yield line.rstrip("\n")
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or text_key not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise KeyError(f"text_key={text_key!r} not found in {path}:{lineno} (has {keys})")
            yield str(record[text_key])


def cache_file_for(files, tokenizer, cache_dir, text_key="text") -> str:
    """``<cache_dir>/tokens-<hash>.npy``: where :func:`tokenize_to_cache` writes the token ids of
    ``files`` (a checked list of paths), so other ranks can wait for that file. The hash covers
    everything the ids depend on: file contents, tokenizer model (and an HF tokenizer's BOS/EOS ids, which
    come from the files next to its tokenizer.json), field name."""
    h = hashlib.sha256(f"v1|{text_key}|".encode())
    if getattr(tokenizer, "cache_key", None):
        h.update(f"{tokenizer.cache_key}|".encode())
    for path in files + [tokenizer.vocab_file]:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"|")
    return os.path.join(cache_dir, f"tokens-{h.hexdigest()[:16]}.npy")


def tokenize_to_cache(data_files, tokenizer, cache_dir, text_key="text"):
    """Tokenize ``data_files`` once into ``<cache_dir>/tokens-<hash>.npy`` and return its path.

    The hash covers inputs and tokenizer, so stale caches are never reused. Tokens are streamed to a raw
    file and then copied into the .npy (no whole-corpus list in memory); the final rename is atomic so
    concurrent ranks may race safely. uint16 is used when the vocabulary fits, halving the size.
    """
    files = check_files(data_files, "data_files")
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    path = cache_file_for(files, tokenizer, cache_dir, text_key)
    if os.path.exists(path):
        return path
    os.makedirs(cache_dir, exist_ok=True)
    raw, tmp = f"{path}.raw{os.getpid()}", f"{path}.tmp{os.getpid()}.npy"
    try:
        count = 0
        with open(raw, "wb") as out:
            for name in files:
                docs = list(read_documents(name, text_key))
                for i in range(0, len(docs), _CHUNK_DOCS):
                    for ids in tokenizer.encode(docs[i:i + _CHUNK_DOCS], add_bos=True, add_eos=True):
                        np.asarray(ids, dtype=dtype).tofile(out)
                        count += len(ids)
        src = np.memmap(raw, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
        dst = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(count,))
        for i in range(0, count, 1 << 24):
            dst[i:i + (1 << 24)] = src[i:i + (1 << 24)]
        dst.flush()
        del src, dst
        os.replace(tmp, path)
    finally:
        for leftover in (raw, tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path


class SampleOrder:
    """Which global samples a data-parallel rank reads, in which order, and where it stands.

    Subclasses set ``num_samples`` and implement ``sample(index)``; this class gives the epoch
    permutation from ``(seed, epoch)``, the rank's strided share, iteration from the current
    position and the resumable ``state_dict`` (see the module docstring)."""

    def _init_order(self, num_samples, seq_length, seed, shuffle, dp_rank, dp_size, drop_remainder):
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        self.num_samples, self.seq_length, self.seed, self.shuffle = num_samples, seq_length, seed, shuffle
        self.dp_rank, self.dp_size, self.drop_remainder = dp_rank, dp_size, drop_remainder
        if drop_remainder:
            self.samples_per_epoch = self.num_samples // dp_size
        else:
            self.samples_per_epoch = len(range(dp_rank, self.num_samples, dp_size))
        if self.samples_per_epoch == 0:
            raise ValueError(f"dp_size={dp_size} exceeds the number of samples ({self.num_samples}) at "
                             f"seq_length={seq_length}")
        self.consumed_samples = 0

    def sample(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement sample(index) -> (input_ids, labels)")

    def epoch_indices(self, epoch):
        """Global sample indices this rank reads in ``epoch``, in order."""
        order = np.arange(self.num_samples)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        return order[self.dp_rank::self.dp_size][:self.samples_per_epoch]

    def __iter__(self):
        epoch, pos = divmod(self.consumed_samples, self.samples_per_epoch)
        for index in self.epoch_indices(epoch)[pos:]:
            self.consumed_samples += 1
            yield self.sample(int(index))

    def state_dict(self, consumed_samples=None):
        """Resumable position. Pass ``consumed_samples`` when a pipeline prefetches (GeneratorDataset runs
        ahead of the training loop): then the trainer's own count of samples it used is authoritative."""
        consumed = self.consumed_samples if consumed_samples is None else int(consumed_samples)
        return {"consumed_samples": consumed, "seed": self.seed, "shuffle": self.shuffle,
                "seq_length": self.seq_length, "num_samples": self.num_samples,
                "dp_rank": self.dp_rank, "dp_size": self.dp_size}

    def load_state_dict(self, state):
        """Restore a position; refuse a state from different data, seed or parallel layout."""
        for key in ("seed", "shuffle", "seq_length", "num_samples", "dp_rank", "dp_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"data state mismatch: {key}={state.get(key)!r} in state, "
                                 f"{getattr(self, key)!r} in this dataset")
        self.consumed_samples = int(state["consumed_samples"])


class PackedDataset(SampleOrder):
    """Iterable source of packed ``(input_ids, labels)`` int32 samples for one data-parallel rank.

    Usable directly (``for ids, labels in ds``) or as the source of ``mindspore.dataset.GeneratorDataset``
    (see :func:`create_dataset`). One ``iter()`` runs to the end of the current epoch, starting at the
    current position, so after a resume the first epoch is the remainder of the interrupted one.

    ``drop_remainder=True`` (default) gives every rank ``num_samples // dp_size`` samples per epoch, so all
    ranks run the same number of steps; up to ``dp_size - 1`` samples (a different few each epoch) are
    skipped. With ``False`` the ranks cover every sample but may differ in length by one.
    """

    def __init__(self, data_files, tokenizer, seq_length, cache_dir=None, text_key="text", seed=0,
                 shuffle=True, dp_rank=0, dp_size=1, drop_remainder=True):
        files = check_files(data_files, "data_files")
        tokenizer = as_tokenizer(tokenizer)      # a tokenizer, or the path of a .model / tokenizer.json / HF folder
        if seq_length < 1:
            raise ValueError(f"seq_length must be >= 1, got {seq_length}")
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        cache_dir = cache_dir or os.path.join(os.path.dirname(os.path.abspath(files[0])), ".token_cache")
        self.cache_path = tokenize_to_cache(files, tokenizer, cache_dir, text_key)
        self._tokens = None
        num_tokens = len(self.tokens)
        num_samples = max(num_tokens - 1, 0) // seq_length
        if num_samples == 0:
            raise ValueError(f"seq_length={seq_length} too large: a sample needs seq_length+1="
                             f"{seq_length + 1} tokens but {files} give only {num_tokens}")
        self._init_order(num_samples, seq_length, seed, shuffle, dp_rank, dp_size, drop_remainder)

    @property
    def tokens(self):
        """The token stream, memory-mapped lazily (so copies of this object, e.g. in workers, stay cheap)."""
        if self._tokens is None:
            self._tokens = np.load(self.cache_path, mmap_mode="r")
        return self._tokens

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}

    def sample(self, index):
        """Packed sample ``index`` (global): ``input_ids`` and ``labels``, both of length ``seq_length``."""
        start = index * self.seq_length
        window = np.asarray(self.tokens[start:start + self.seq_length + 1], dtype=np.int32)
        return window[:-1], window[1:]


def create_dataset(source, batch_size, drop_remainder=True):
    """``mindspore.dataset.GeneratorDataset`` over ``source``, batched. Columns: input_ids, labels.

    ``shuffle=False`` because the order is already decided (deterministically) by the source, and one
    in-process worker keeps it that way.
    """
    import mindspore.dataset as ds  # imported here: tokenizing and packing do not need MindSpore
    data = ds.GeneratorDataset(source, column_names=["input_ids", "labels"], shuffle=False,
                               num_parallel_workers=1, python_multiprocessing=False)
    return data.batch(batch_size, drop_remainder=drop_remainder)
