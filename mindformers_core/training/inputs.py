"""The trainer's inputs: corpus, tokenizer, this data-parallel rank's packed samples, batch sizes.

Batches follow MindFormers: ``batch_size`` rows per microbatch; a step takes ``micro_batch_num``
microbatches (pipeline) times ``gradient_accumulation_steps`` micro-steps per data-parallel rank.
Rank 0 writes what is shared (the built-in corpus, the trained tokenizer, the token cache); the
other ranks wait for the finished file.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

import numpy as np

from ..common.batch import Batch, map_batch, stack_samples
from ..common.sequence_placement import storage_positions
from ..data.corpus import build_corpus
from ..data.dataset import PackedDataset, cache_file_for, tokenize_to_cache
from ..data.tokenizer import LlamaTokenizer, build_tokenizer, train_tokenizer
from .config import Config, ConfigError
from .preflight import Preflight
from .rules import context_parallel_algorithm
from .shape import JobShape

BUILTIN_CORPUS_BYTES = 2_000_000


def wait_for(path: str, timeout: float = 600.0) -> None:
    """Block until rank 0 has published ``path`` (it writes a temporary name and renames)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for rank 0 to write {path}")
        time.sleep(0.2)


@dataclass
class Inputs:
    tokenizer: LlamaTokenizer
    data: object                    # PackedDataset or MindRecordDataset of this data-parallel rank
    eval_data: Optional[object]
    micro_batch: int                # rows of one microbatch
    local_batch: int                # rows of one step on one data-parallel rank
    global_batch: int
    total_steps: int
    sequence_slice: Optional[Callable[[np.ndarray], np.ndarray]] = None   # context parallel: this rank's tokens

    def _cut(self, batch: Batch) -> Batch:
        if self.sequence_slice is None:
            return batch
        return map_batch(batch, self.sequence_slice)

    def batches(self) -> Iterator[Batch]:
        """Local batches (dicts, ``common/batch.py``) of this data-parallel rank; the dataset resumes from
        its consumed count and continues into the next epoch at the end of one."""
        it = iter(self.data)
        while True:
            rows = []
            while len(rows) < self.local_batch:
                sample = next(it, None)
                if sample is None:
                    it = iter(self.data)
                    continue
                rows.append(sample)
            yield self._cut(stack_samples(rows))

    def position(self) -> int:
        """Samples this rank has drawn (where the next local batch starts)."""
        return int(self.data.consumed_samples)

    def global_targets(self, start: int) -> Optional[float]:
        """Target tokens of the global batch whose local part starts at ``start`` (the same number on every
        rank, no communication: ``SFTDataset.global_targets``); None for data without a ``loss_mask``."""
        count = getattr(self.data, "global_targets", None)
        return None if count is None else count(start, self.local_batch)

    def eval_batches(self, steps: int) -> Iterator[Batch]:
        """The first ``steps`` microbatches of the held-out data: the same ones every time."""
        self.eval_data.consumed_samples = 0
        it = iter(self.eval_data)
        for _ in range(steps):
            yield self._cut(stack_samples([next(it) for _ in range(self.micro_batch)]))


def context_parallel_slice(cfg: Config, shape: JobShape, cp_rank: int) -> Optional[Callable]:
    """Context parallelism: ``(rows, seq) -> (rows, seq / cp)``, this cp rank's tokens of a batch
    put in storage order (the load-balanced ring's chunks i and 2*ring-1-i; see
    common/sequence_placement.py). Inputs and labels are cut the same way: labels stay aligned
    with their inputs, and the mean loss over all tokens does not depend on the order."""
    if shape.cp == 1:
        return None
    pc = cfg.parallel_config
    seq = int(cfg.model.model_config.seq_length)
    positions = storage_positions(seq, shape.cp, context_parallel_algorithm(dict(pc)), pc.get("ulysses_degree_in_cp"),
                                  bool(pc.get("context_parallel_load_balance", True)))
    n = seq // shape.cp
    mine = positions[cp_rank * n:(cp_rank + 1) * n]
    return lambda a: np.ascontiguousarray(np.asarray(a)[:, mine])


def launch_rank() -> int:
    """This process's rank before any process group exists (msrun's ``RANK_ID``; 0 outside msrun)."""
    value = os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0"))
    return int(value) if str(value).isdigit() else 0


def hf_rows(cfg: Config, found: Preflight, output_dir: str, rank: Optional[int] = None):
    """MindFormers' HFDataLoader (train_dataset.type hf): local data through the datasets library and the
    handler chain into rows of seq_length (data/hf_dataset.py), with what became of the records (cut, dropped
    and why: ``SFTRows.lines``). Runs before any process group (the Trainer's constructor): every rank builds
    the same rows (small fine-tuning sets; datasets' cache is per rank). Bad data (a broken JSON line, a column
    a handler needs, no record with a target token) is a ConfigError naming it."""
    from ..data.handlers import parse_handlers
    from ..data.hf_dataset import load_hf_dataset, sft_rows
    ds, seq = cfg.train_dataset, int(cfg.model.model_config.seq_length)
    rank = launch_rank() if rank is None else rank
    try:
        chain = parse_handlers(ds.handler)
        data = load_hf_dataset(ds.path, ds.load_func, ds.split, ds.data_files,
                               cache_dir=os.path.join(output_dir, "hf_datasets_cache", f"rank_{rank}"),
                               name="train_dataset.data_loader.path")
        cap = int(ds.compressed_eod_mask_length) if ds.create_compressed_eod_mask else None
        return sft_rows(data, chain, build_tokenizer(found.tokenizer_kind, found.tokenizer_file), seq, cap,
                        source=f"train_dataset.data_loader.path {ds.path!r}")
    except ValueError as e:
        raise ConfigError([str(e)]) from None


def hf_data(cfg: Config, tokenizer, output_dir: str, rank: int, order: dict, prepared=None, found=None):
    """This data-parallel rank's SFTDataset of the HFDataLoader rows (``prepared``: :func:`hf_rows`' result,
    made before the process group; else made here)."""
    from ..data.handlers import parse_handlers
    from ..data.hf_dataset import SFTDataset, feed_keys
    ds = cfg.train_dataset
    if prepared is None:
        prepared = hf_rows(cfg, found, output_dir, rank)
    try:
        chain = parse_handlers(ds.handler)
        keys = feed_keys(ds.input_columns, chain.pack_strategy is not None)
        return SFTDataset(prepared.rows, keys, **order)
    except ValueError as e:
        raise ConfigError([str(e)]) from None


def build_inputs(cfg: Config, shape: JobShape, found: Preflight, rank: int, dp_rank: int,
                 output_dir: str, cp_rank: int = 0, sft=None) -> Inputs:
    """``sft``: the HFDataLoader rows made before the process group (:func:`hf_rows`), if any."""
    ds, mc = cfg.train_dataset, cfg.model.model_config
    files = found.files
    if not ds.dataset_dir and ds.type != "hf":     # the built-in corpus, written once by rank 0
        if rank == 0 and not os.path.exists(files[0]):
            build_corpus(files[0], max_bytes=BUILTIN_CORPUS_BYTES)
        wait_for(files[0])
    tok = found.tokenizer_file
    if rank == 0 and not os.path.exists(tok):
        prefix = tok[:-len(".model")]
        trained = train_tokenizer(files, prefix + ".tmp", int(mc.vocab_size))
        os.replace(prefix + ".tmp.vocab", prefix + ".vocab")
        os.replace(trained, tok)             # the .model last: its presence means "done"
    wait_for(tok)
    tokenizer = build_tokenizer(found.tokenizer_kind, tok)
    padded = found.tokenizer_kind == "hf" and tokenizer.vocab_size < int(mc.vocab_size)   # HF embeddings may be padded
    if tokenizer.vocab_size != int(mc.vocab_size) and not padded:
        raise ConfigError([f"model.model_config.vocab_size = {mc.vocab_size}: must equal the tokenizer's "
                           f"vocabulary, {tokenizer.vocab_size} pieces in {tok}"])

    def dataset(key: str, kind: str, directory: Optional[str], paths: List[str], shuffle: bool):
        order = dict(seed=int(cfg.seed), shuffle=shuffle, dp_rank=dp_rank, dp_size=shape.dp)
        if kind == "hf":                    # its errors name the data_loader keys themselves
            return hf_data(cfg, tokenizer, output_dir, rank, order, prepared=sft, found=found)
        try:
            if kind == "mindrecord":
                from ..data.mindrecord import MindRecordDataset
                return MindRecordDataset(os.path.abspath(directory), int(mc.seq_length), **order)
            if kind == "megatron":
                from ..data.megatron import MegatronDataset
                try:
                    return MegatronDataset(cfg[key].data_path, int(mc.seq_length), vocab_size=int(mc.vocab_size),
                                           **order)
                except ValueError as e:
                    raise ConfigError([f"{key}.data_path = {cfg[key].data_path!r}: {e}"]) from None
            cache = os.path.join(output_dir, "token_cache")
            if rank == 0:                   # tokenize once; the others wait for the cache file
                tokenize_to_cache(paths, tokenizer, cache, "text")
            else:
                wait_for(cache_file_for(paths, tokenizer, cache, "text"))
            return PackedDataset(paths, tokenizer, int(mc.seq_length), cache_dir=cache, **order)
        except ValueError as e:
            raise ConfigError([f"{key}.dataset_dir = {directory!r}: {e}"]) from None

    data = dataset("train_dataset", ds.type, ds.dataset_dir, files, bool(ds.shuffle))
    micro_batch = int(cfg.runner_config.batch_size)
    eval_data = None
    if found.eval_files:
        ev = cfg.eval_dataset
        eval_data = dataset("eval_dataset", ev.type, ev.dataset_dir, found.eval_files, False)
        need = int(ev.eval_steps) * micro_batch
        if eval_data.samples_per_epoch < need:
            raise ConfigError([f"eval_dataset.eval_steps = {ev.eval_steps}: needs {need} samples per data-parallel "
                               f"rank (x batch_size {micro_batch}), the eval data has "
                               f"{eval_data.samples_per_epoch}"])
    local_batch = micro_batch * shape.micro_batch_num * shape.accumulate
    steps_per_epoch = data.samples_per_epoch // local_batch
    if steps_per_epoch < 1:
        raise ConfigError([f"runner_config.batch_size = {micro_batch}: a step takes {local_batch} "
                           f"samples per data-parallel rank (x micro_batch_num {shape.micro_batch_num} x "
                           f"gradient_accumulation_steps {shape.accumulate}) but each data-parallel rank has "
                           f"only {data.samples_per_epoch} samples of {mc.seq_length} tokens per epoch"])
    total_steps = steps_per_epoch * int(cfg.runner_config.epochs)
    if int(cfg.runner_config.max_steps) > 0:
        total_steps = min(total_steps, int(cfg.runner_config.max_steps))
    return Inputs(tokenizer, data, eval_data, micro_batch, local_batch, local_batch * shape.dp, total_steps,
                  context_parallel_slice(cfg, shape, cp_rank))
