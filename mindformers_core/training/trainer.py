"""The YAML-driven trainer behind ``run_mindformer.py``.

Order of construction (errors as early as possible):

1. ``Trainer(config)``: checks what the trainer itself supports, the pipeline schedule (built
   from stage placeholders, so its validator runs), the data and tokenizer files, the tokenizer's
   vocabulary against ``vocab_size``, the checkpoint to load — all before any process group
   exists, as one :class:`ConfigError`.
2. ``setup()``: distributed init → tokenizer and data (each data-parallel rank its own slice) →
   model (``research/llama``; with ``pipeline_stage > 1`` only this rank's stages) →
   ``parallelize`` (tensor/sequence parallel from the layers' ``shard()``, over this stage's
   ranks) → recompute/swap by Cell name → pipeline schedule → optimizer (AdamW + lr schedule,
   global-norm clipping over tp and pp).
3. ``train()``: load/resume → loop. The same loop runs eagerly (``context.mode: 1``) or compiled
   (``mode: 0``: one ``ms.jit`` step; with a pipeline or gradient accumulation, compiled stage
   and update functions driven by a Python loop).

Ranks are ordered pipeline-outermost (see ``topology.py``). Batches follow MindFormers: a step
takes ``batch_size x micro_batch_num x gradient_accumulation_steps`` rows per data-parallel
rank. ``context_parallel > 1`` and the parallel optimizer are not wired (error / warning).
See docs/quickstart.md.
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from ..checkpoint import (CheckpointError, list_steps, load_checkpoint, load_optimizer_state, load_training_state,
                          save_checkpoint, shard_single_file)
from ..checkpoint.format import METADATA, TRACKER, read_tracker
from ..data.corpus import build_corpus
from ..data.dataset import PackedDataset, tokenize_to_cache
from ..data.tokenizer import LlamaTokenizer, train_tokenizer
from ..distributed.env import get_env, init_distributed
from ..optim import AdamW, ClipGradNorm, build_lr_schedule, replication_weights
from ..pipeline.schedules import build_schedule
from ..pipeline.stage import StageInfo
from ..sharding.layout import Layout
from ..sharding.parallelizer import GradientReducer, parallelize
from .config import Config, ConfigError
from .topology import Topology

MODELS = ("LlamaForCausalLM",)
BUILTIN_CORPUS_BYTES = 2_000_000
_STEP_DIR = re.compile(r"^step_(\d+)$")
_LOCAL_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")
_JSONL = (".jsonl", ".json")


def _log(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


def _wait_for(path: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for rank 0 to write {path}")
        time.sleep(0.2)


def _set(param, value: np.ndarray) -> None:
    """Overwrite a Parameter in place (same object: value_and_grad and the optimizer hold it)."""
    value = np.asarray(value)
    if tuple(param.shape) != value.shape:
        raise ValueError(f"{param.name}: checkpoint slice has shape {value.shape}, the parameter {tuple(param.shape)}")
    param.set_data(Tensor(value.astype(ms.dtype_to_nptype(param.dtype), copy=False)))


def data_files(path: str, kind: str, section: str = "train_dataset") -> List[str]:
    """The files ``<section>.dataset_dir`` names: the file itself, or the directory's regular,
    non-hidden files of the dataset type (``.jsonl``/``.json`` for jsonl, any other for text), sorted;
    for ``mindrecord``, the ``.mindrecord`` file or the directory's ones. Raises ConfigError naming
    the key."""
    key = f"{section}.dataset_dir = {path!r}"
    if kind == "mindrecord":
        from ..data.mindrecord import mindrecord_files
        try:
            return mindrecord_files(path)
        except FileNotFoundError as e:
            raise ConfigError([f"{key}: {e}"]) from None
    if not os.path.exists(path):
        raise ConfigError([f"{key}: no such file or directory"])
    if os.path.isfile(path):
        if (kind == "jsonl") != path.endswith(_JSONL):
            raise ConfigError([f"{key}: a {'JSONL' if path.endswith(_JSONL) else 'plain-text'} file but "
                               f"{section}.type = {kind!r}; text files hold one document per line, "
                               f"jsonl files (.jsonl/.json) one {{\"text\": ...}} object per line"])
        return [path]
    files = sorted(os.path.join(path, n) for n in os.listdir(path)
                   if not n.startswith(".") and not n.endswith((".tmp", ".npy"))
                   and os.path.isfile(os.path.join(path, n)) and (kind == "jsonl") == n.endswith(_JSONL))
    if not files:
        want = "*.jsonl/*.json" if kind == "jsonl" else "text files (not .jsonl/.json)"
        raise ConfigError([f"{key}: directory holds no {want} for {section}.type = {kind!r}"])
    return files


def resolve_checkpoint(path: str, key: str = "load_checkpoint") -> Tuple[str, Any]:
    """``(root, step)`` for a checkpoint path: a root directory (``"latest"``), one of its
    ``step_<k>`` directories, or ``("file", path)`` for a safetensors file of full tensors."""
    where = f"{key} = {path!r}"
    if os.path.isfile(path):
        if not path.endswith(".safetensors"):
            raise ConfigError([f"{where}: a file, but only .safetensors files of full tensors load directly "
                               "(or give a checkpoint directory written by this trainer)"])
        return "file", path
    if not os.path.isdir(path):
        raise ConfigError([f"{where}: no such checkpoint directory or file"])
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if m and os.path.isfile(os.path.join(path, METADATA)):
        return os.path.dirname(os.path.normpath(path)), int(m.group(1))
    if os.path.isfile(os.path.join(path, TRACKER)) or list_steps(path):
        return path, "latest"
    raise ConfigError([f"{where}: not a checkpoint directory (no {TRACKER} and no step_<k>/ inside); give the "
                       "<output_dir>/checkpoint directory, one of its step_<k> directories, or a .safetensors file"])


class Trainer:
    """``Trainer(config).train()``; ``config`` is a validated :class:`Config`.

    ``worker_num`` is the number of workers the job runs on (msrun ``--worker_num``); by default the
    ``MS_WORKER_NUM`` msrun exports, else 1. The constructor raises :class:`ConfigError` for
    everything the trainer can check without a process group.
    """

    def __init__(self, config: Config, worker_num: Optional[int] = None):
        self.cfg = config
        pc = config.parallel_config
        self.dp, self.tp, self.pp = int(pc.data_parallel), int(pc.model_parallel), int(pc.pipeline_stage)
        self.micro_batch_num = int(pc.micro_batch_num) if self.pp > 1 else 1
        self.accumulate = int(config.runner_config.gradient_accumulation_steps)
        self.output_dir = os.path.abspath(config.output_dir)
        self.mode = int(config.context.mode)
        self.predicting = config.run_mode == "predict"
        self.worker_num = int(os.environ.get("MS_WORKER_NUM", "1")) if worker_num is None else int(worker_num)
        self.warnings: List[str] = []
        self._ready = False
        self.start_step = 0
        self.preflight()

    # ------------------------------------------------------------------ checks before any process group
    def preflight(self) -> None:
        """Everything the trainer can check before distributed init; raises one ConfigError."""
        cfg, errors = self.cfg, []
        pc, rc = cfg.parallel_config, cfg.runner_config
        if int(pc.pipeline_stage) > 1:
            errors += self._pipeline_errors()
        if int(pc.context_parallel) > 1:
            errors.append(f"parallel_config.context_parallel = {pc.context_parallel}: context-parallel attention is "
                          "not implemented; use context_parallel: 1")
        if cfg.model.arch.type not in MODELS:
            errors.append(f"model.arch.type = {cfg.model.arch.type!r}: this trainer builds {list(MODELS)} "
                          "(research/llama)")
        if cfg.optimizer.type != "AdamW":
            errors.append(f"optimizer.type = {cfg.optimizer.type!r}: only AdamW is wired into this trainer")
        max_steps = int(rc.max_steps)
        if max_steps == 0 or max_steps < -1:
            errors.append(f"runner_config.max_steps = {max_steps}: must be -1 (the epochs decide) or >= 1")
        if float(rc.max_grad_norm) < 0:
            errors.append(f"runner_config.max_grad_norm = {rc.max_grad_norm}: must be >= 0 (0 = no clipping)")
        lc = cfg.lr_schedule
        if lc.warmup_steps is not None and int(lc.total_steps) > 0 and lc.type != "ConstantWarmUpLR" \
                and int(lc.warmup_steps) >= int(lc.total_steps):
            errors.append(f"lr_schedule.warmup_steps = {lc.warmup_steps}: must be < lr_schedule.total_steps = "
                          f"{lc.total_steps} for {lc.type}")
        if self.predicting and self.worker_num > 1:
            errors.append(f"run_mode = 'predict': runs on one process, not {self.worker_num} workers "
                          "(start it without msrun, use_parallel: False)")
        product = self.dp * self.tp * int(pc.context_parallel) * int(pc.pipeline_stage)
        if product != self.worker_num:
            errors.append(f"parallel_config = data_parallel {self.dp} x model_parallel {self.tp} x context_parallel "
                          f"{pc.context_parallel} x pipeline_stage {pc.pipeline_stage} = {product}: must equal the "
                          f"worker count {self.worker_num} (msrun --worker_num)")
        if errors:
            raise ConfigError(errors)

        self.checkpoint_source = self._checkpoint_source(errors)
        if not self.predicting:
            try:
                if cfg.train_dataset.type == "mindrecord":
                    self.files = self._mindrecord_files(errors)
                elif cfg.train_dataset.dataset_dir:
                    self.files = data_files(os.path.abspath(cfg.train_dataset.dataset_dir), cfg.train_dataset.type)
                elif cfg.train_dataset.type != "text":
                    errors.append(f"train_dataset.type = {cfg.train_dataset.type!r}: the built-in corpus "
                                  "(dataset_dir: null) is plain text; use type: text or give a dataset_dir")
                else:
                    self.files = [os.path.join(self.output_dir, "corpus.txt")]   # built in setup()
            except ConfigError as e:
                errors += e.errors
        self.tokenizer_file = self._tokenizer_file(errors)
        self.eval_files = self._eval_files(errors) if not self.predicting else None
        self.sharded_dp = bool(cfg.parallel.enable_parallel_optimizer)
        if self.sharded_dp and self.pp > 1 and self.accumulate > 1:
            errors.append(f"runner_config.gradient_accumulation_steps = {self.accumulate}: with pipeline_stage > 1 "
                          "and enable_parallel_optimizer (hsdp) accumulate through micro_batch_num instead (the "
                          "schedule already sums microbatch gradients); use 1")
        if self.sharded_dp and self.dp == 1:
            self.warnings.append("warning: parallel.enable_parallel_optimizer = True with data_parallel 1: nothing "
                                 "to shard over; hsdp runs with one rank per shard group")
        if errors:
            raise ConfigError(errors)

    def _eval_files(self, errors: List[str]) -> Optional[List[str]]:
        """EvalCallBack's held-out data (``eval_dataset``), or None without that callback."""
        if self._callback("EvalCallBack") is None:
            return None
        ev = self.cfg.eval_dataset
        if self.pp > 1:
            errors.append(f"callbacks: EvalCallBack with parallel_config.pipeline_stage = {self.pp}: evaluation runs "
                          "the whole model's forward and the pipeline runtime has no forward-only schedule yet; "
                          "evaluate a checkpoint on pipeline_stage 1 instead")
            return None
        if not ev.dataset_dir:
            errors.append("eval_dataset.dataset_dir = None: EvalCallBack needs held-out data (a file or directory of "
                          "eval_dataset.type)")
            return None
        try:
            return data_files(os.path.abspath(ev.dataset_dir), ev.type, "eval_dataset")
        except ConfigError as e:
            errors += e.errors
        return None

    def _mindrecord_files(self, errors: List[str]) -> List[str]:
        """MindRecord data: a .mindrecord file or a directory of them, and the tokenizer it was made with."""
        ds = self.cfg.train_dataset
        if not ds.dataset_dir:
            errors.append("train_dataset.type = 'mindrecord': needs train_dataset.dataset_dir (a .mindrecord file "
                          "or a directory of them, written by scripts/preprocess_mindrecord.py)")
            return []
        if not ds.tokenizer_file:
            errors.append("train_dataset.type = 'mindrecord': needs train_dataset.tokenizer_file, the tokenizer the "
                          "MindRecord data was written with (token ids mean nothing without it)")
        return data_files(os.path.abspath(ds.dataset_dir), ds.type)

    def _pipeline_errors(self) -> List[str]:
        """Pipeline settings the schema cannot judge alone: build this job's schedule from stage
        placeholders (pure logic: the schedule's own validator runs) and check the model fits."""
        cfg, pc = self.cfg, self.cfg.parallel_config
        pipe = cfg.parallel.pipeline_config
        errors = []
        if cfg.model.model_config.tie_word_embeddings:
            errors.append("model.model_config.tie_word_embeddings = True: with parallel_config.pipeline_stage = "
                          f"{pc.pipeline_stage} the embedding (first stage) and output layer (last stage) live on "
                          "different ranks; set tie_word_embeddings: False")
        topo = Topology(0, int(pc.pipeline_stage), self.dp, self.tp, int(pipe.pipeline_interleave),
                        pipe.pipeline_scheduler)
        if isinstance(pipe.layers_per_stage, list):   # (the schema's rules checked the split itself)
            try:
                ranges = topo.layer_ranges(int(cfg.model.model_config.num_layers), pipe.layers_per_stage)
            except (TypeError, ValueError):
                ranges = None
            for r in range(topo.pp) if ranges else ():
                held = [s for s, q in enumerate(topo.placement) if q == r]
                if not any(len(ranges[s]) for s in held) and 0 not in held and topo.stage_num - 1 not in held:
                    errors.append(f"parallel.pipeline_config.layers_per_stage = {pipe.layers_per_stage}: pipeline "
                                  f"rank {r} would hold stages {held} with no layers and no embedding or output "
                                  "layer (nothing to train); give every rank at least one layer")
        try:
            build_schedule(pipe.pipeline_scheduler, [StageInfo(s, topo.stage_num) for s in topo.stages],
                           int(pc.micro_batch_num))
        except ValueError as e:
            errors.append(f"parallel.pipeline_config.pipeline_scheduler = {pipe.pipeline_scheduler!r} with "
                          f"parallel_config.pipeline_stage {pc.pipeline_stage}, pipeline_interleave "
                          f"{pipe.pipeline_interleave}, micro_batch_num {pc.micro_batch_num}: {e}")
        return errors

    def _checkpoint_source(self, errors: List[str]) -> Optional[Tuple[str, Any, bool]]:
        """``(root or "file", step or path, resume)`` to load at the start, or None."""
        cfg = self.cfg
        resume = cfg.resume_training
        try:
            if isinstance(resume, str) and resume.strip():
                if os.path.exists(resume):
                    root, step = resolve_checkpoint(resume, "resume_training")
                else:   # a step of load_checkpoint (or of <output_dir>/checkpoint): "step_6" or "6"
                    base = cfg.load_checkpoint or os.path.join(self.output_dir, "checkpoint")
                    m = re.fullmatch(r"(?:step_)?(\d+)", resume.strip())
                    if not m:
                        raise ConfigError([f"resume_training = {resume!r}: must be True/False, a checkpoint path, "
                                           f"or a step ('step_6' or '6') of {base}"])
                    root, step = resolve_checkpoint(os.path.join(base, f"step_{m.group(1)}"), "resume_training")
                if root == "file":
                    raise ConfigError([f"resume_training = {resume!r}: a single file holds weights only; resume "
                                       "needs a checkpoint directory (optimizer and data state)"])
                return root, step, True
            if cfg.load_checkpoint:
                root, step = resolve_checkpoint(cfg.load_checkpoint)
                if resume and root == "file":
                    raise ConfigError([f"load_checkpoint = {cfg.load_checkpoint!r}: a single file holds weights "
                                       "only; resume_training needs a checkpoint directory"])
                return root, step, bool(resume) and not self.predicting
            if resume:
                own = os.path.join(self.output_dir, "checkpoint")
                if read_tracker(own) is not None or list_steps(own):
                    return own, "latest", True
                self.warnings.append(f"resume_training = True: no checkpoint in {own} yet; starting at step 0")
        except ConfigError as e:
            errors += e.errors
        except CheckpointError as e:
            errors.append(f"load_checkpoint = {cfg.load_checkpoint!r}: {e}")
        return None

    def _tokenizer_file(self, errors: List[str]) -> str:
        """The tokenizer to use: train_dataset.tokenizer_file, else (predict) the one the checkpoint
        was trained with, else <output_dir>/tokenizer_<vocab>.model (trained in setup when missing)."""
        cfg = self.cfg
        vocab = int(cfg.model.model_config.vocab_size)
        tok = cfg.train_dataset.tokenizer_file
        key = "train_dataset.tokenizer_file"
        if not tok and self.predicting and self.checkpoint_source and self.checkpoint_source[0] != "file":
            root, step = self.checkpoint_source[:2]
            try:
                tok = (load_training_state(root, step).trainer_state or {}).get("tokenizer_file")
                key = f"the tokenizer recorded in the checkpoint {root}"
            except CheckpointError:
                tok = None
        if not tok:
            own = os.path.join(self.output_dir, f"tokenizer_{vocab}.model")
            if self.predicting and not os.path.exists(own):
                errors.append(f"train_dataset.tokenizer_file = None: predict needs the tokenizer the model was "
                              f"trained with; give train_dataset.tokenizer_file (no {own})")
            elif not os.path.exists(own) and vocab <= 259:
                errors.append(f"model.model_config.vocab_size = {vocab}: too small to train a byte-fallback "
                              "tokenizer (needs > 259: 3 special + 256 byte pieces); give "
                              "train_dataset.tokenizer_file or a larger vocab_size")
            if not os.path.exists(own):
                return own
            tok, key = own, f"the tokenizer {own} (trained by an earlier run in output_dir)"
        tok = os.path.abspath(tok)
        if not os.path.isfile(tok):
            errors.append(f"{key} = {tok!r}: no such file")
            return tok
        try:
            pieces = LlamaTokenizer(tok).vocab_size
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError variants
            errors.append(f"{key} = {tok!r}: not a sentencepiece model ({type(e).__name__}: {e})")
            return tok
        if pieces != vocab:
            errors.append(f"model.model_config.vocab_size = {vocab}: must equal the tokenizer's vocabulary, "
                          f"{pieces} pieces in {key} = {tok!r}")
        return tok

    # ------------------------------------------------------------------ build
    def setup(self) -> None:
        """Distributed init, data, model, optimizer (predict: tokenizer and model only). Idempotent."""
        if self._ready:
            return
        cfg = self.cfg
        ms.set_context(mode=ms.PYNATIVE_MODE)   # tracing for the plan is PyNative; jit wraps the step
        env = init_distributed() if cfg.use_parallel else get_env()
        self.rank, self.world = env.rank, env.world_size
        if self.dp * self.tp * self.pp != self.world:
            raise ConfigError([f"parallel_config = data_parallel {self.dp} x model_parallel {self.tp} x "
                               f"pipeline_stage {self.pp} = {self.dp * self.tp * self.pp}: must equal the "
                               f"{self.world} worker(s) running"])
        pipe = cfg.parallel.pipeline_config
        self.topology = Topology(self.rank, self.pp, self.dp, self.tp, int(pipe.pipeline_interleave) if self.pp > 1
                                 else 1, pipe.pipeline_scheduler)
        for w in self.warnings:
            _log(self.rank, w)
        ms.set_seed(int(cfg.seed))
        np.random.seed(int(cfg.seed))
        os.makedirs(self.output_dir, exist_ok=True)
        if self.predicting:
            self.tokenizer = LlamaTokenizer(self.tokenizer_file)
            self.global_batch = self.local_batch = self.micro_batch = 1
            self._build_model()
        else:
            self._build_data()
            self._build_model()
            self._build_optimizer()
        self._ready = True

    def _build_data(self) -> None:
        cfg, ds = self.cfg, self.cfg.train_dataset
        mc = cfg.model.model_config
        files = self.files
        if not ds.dataset_dir:                  # the built-in corpus, written once by rank 0
            if self.rank == 0 and not os.path.exists(files[0]):
                build_corpus(files[0], max_bytes=BUILTIN_CORPUS_BYTES)
            _wait_for(files[0])
        tok = self.tokenizer_file
        if self.rank == 0 and not os.path.exists(tok):
            prefix = tok[:-len(".model")]
            trained = train_tokenizer(files, prefix + ".tmp", int(mc.vocab_size))
            os.replace(prefix + ".tmp.vocab", prefix + ".vocab")
            os.replace(trained, tok)             # the .model last: its presence means "done"
        _wait_for(tok)
        self.tokenizer = LlamaTokenizer(tok)
        if self.tokenizer.vocab_size != int(mc.vocab_size):
            raise ConfigError([f"model.model_config.vocab_size = {mc.vocab_size}: must equal the tokenizer's "
                               f"vocabulary, {self.tokenizer.vocab_size} pieces in {tok}"])
        self.data = self._dataset("train_dataset", ds.type, ds.dataset_dir, files, bool(ds.shuffle))
        if self.eval_files:
            ev = cfg.eval_dataset
            self.eval_data = self._dataset("eval_dataset", ev.type, ev.dataset_dir, self.eval_files, False)
            need = int(ev.eval_steps) * int(cfg.runner_config.batch_size)
            if self.eval_data.samples_per_epoch < need:
                raise ConfigError([f"eval_dataset.eval_steps = {ev.eval_steps}: needs {need} samples per data-parallel "
                                   f"rank (x batch_size {cfg.runner_config.batch_size}), the eval data has "
                                   f"{self.eval_data.samples_per_epoch}"])
        # MindFormers' batch: batch_size rows per microbatch; a step takes micro_batch_num
        # microbatches (pipeline) times gradient_accumulation_steps micro-steps per data-parallel rank
        self.micro_batch = int(cfg.runner_config.batch_size)
        self.local_batch = self.micro_batch * self.micro_batch_num * self.accumulate
        self.global_batch = self.local_batch * self.dp
        self.steps_per_epoch = self.data.samples_per_epoch // self.local_batch
        if self.steps_per_epoch < 1:
            raise ConfigError([f"runner_config.batch_size = {self.micro_batch}: a step takes {self.local_batch} "
                               f"samples per data-parallel rank (x micro_batch_num {self.micro_batch_num} x "
                               f"gradient_accumulation_steps {self.accumulate}) but each data-parallel rank has "
                               f"only {self.data.samples_per_epoch} samples of {mc.seq_length} tokens per epoch"])
        self.total_steps = self.steps_per_epoch * int(cfg.runner_config.epochs)
        if int(cfg.runner_config.max_steps) > 0:
            self.total_steps = min(self.total_steps, int(cfg.runner_config.max_steps))

    def _dataset(self, key: str, kind: str, directory: Optional[str], files: List[str], shuffle: bool):
        """This data-parallel rank's packed samples: MindRecord rows, or text/JSONL tokenized once by
        rank 0 into a cache the other ranks wait for."""
        mc = self.cfg.model.model_config
        order = dict(seed=int(self.cfg.seed), shuffle=shuffle, dp_rank=self.topology.dp_rank, dp_size=self.dp)
        try:
            if kind == "mindrecord":
                from ..data.mindrecord import MindRecordDataset
                return MindRecordDataset(os.path.abspath(directory), int(mc.seq_length), **order)
            cache = os.path.join(self.output_dir, "token_cache")
            if self.rank == 0:                       # tokenize once; the others wait for the cache file
                tokenize_to_cache(files, self.tokenizer, cache, "text")
            else:
                from ..data.dataset import cache_file_for   # same name rank 0 writes (content hash)
                _wait_for(cache_file_for(files, self.tokenizer, cache, "text"))
            return PackedDataset(files, self.tokenizer, int(mc.seq_length), cache_dir=cache, **order)
        except ValueError as e:
            raise ConfigError([f"{key}.dataset_dir = {directory!r}: {e}"]) from None

    def evaluate(self) -> float:
        """Mean loss over the first ``eval_dataset.eval_steps`` batches of the held-out data (the
        same batches every time), forward only, eagerly, dropout off."""
        data, rows = self.eval_data, self.micro_batch
        data.consumed_samples = 0
        it = iter(data)
        was_training = self.model.training
        self.model.set_train(False)
        total = 0.0
        try:
            with self._full_weights():
                for _ in range(int(self.cfg.eval_dataset.eval_steps)):
                    batch = [next(it) for _ in range(rows)]
                    ids = np.stack([b[0] for b in batch]).astype(np.int32)
                    labels = np.stack([b[1] for b in batch]).astype(np.int32)
                    total += float(self.model(Tensor(ids), Tensor(labels)).asnumpy())
        finally:
            self.model.set_train(was_training)
        return total / int(self.cfg.eval_dataset.eval_steps)

    def _build_model(self) -> None:
        """The Llama (one model, or this rank's pipeline stages), sharded over this stage's ranks
        by the layers' shard() declarations, with recompute/swap applied by Cell name."""
        from research.llama.llama import LlamaConfig, LlamaForCausalLM
        cfg, topo = self.cfg, self.topology
        pc = dict(cfg.parallel_config)
        self.model_config = LlamaConfig.from_model_config(cfg.model.model_config, pc)
        mcfg = self.model_config
        mcfg.data_parallel_size = self.dp
        mcfg.tensor_model_parallel_size = self.tp
        mcfg.pipeline_model_parallel_size = self.pp
        mcfg.virtual_pipeline_model_parallel_size = topo.vpp if topo.vpp > 1 else None
        mcfg.sequence_parallel = bool(pc.get("use_seq_parallel", False)) and self.tp > 1
        mesh = Layout((self.dp, 1, self.tp), ("dp", "cp", "tp"), topo.stage_ranks)
        seq = int(cfg.model.model_config.seq_length)
        rows = self.micro_batch * self.dp          # global rows of one microbatch (plans see global shapes)
        ids = np.zeros((rows, seq), np.int32)
        counts = self._layer_counts() if self.pp > 1 else None
        self.chunks = []
        for s in topo.stages:
            ms.set_seed(int(cfg.seed))
            if self.pp == 1:
                chunk = LlamaForCausalLM(mcfg)
                parallelize(chunk, mcfg, ids, ids, mesh=mesh, rank=self.rank)
            else:
                chunk = LlamaForCausalLM(mcfg, pp_rank=s % self.pp, vp_stage=s // self.pp if topo.vpp > 1 else None,
                                         layers_per_stage=counts)
                self._parallelize_stage(chunk, s, mesh, ids)
                numbers = chunk.decoder.layer_numbers    # local layer i is global layer numbers[i] - 1
                for p in chunk.trainable_params():       # global names: unique per rank, checkpoint-ready
                    p.name = _LOCAL_LAYER.sub(lambda m: f"decoder.layers.{numbers[int(m.group(1))] - 1}.", p.name)
            self._apply_recompute(chunk)
            self.chunks.append(chunk)
        self.model = self.chunks[0]
        self.plan = self.model.mfc_sharding_plan
        self.params = [p for chunk in self.chunks for p in chunk.trainable_params()]

    def _layer_counts(self) -> Optional[List[int]]:
        """Layers per stage in model order: explicit ``layers_per_stage``, measured (``auto``), or
        None (MindFormers' ``offset``, or uniform)."""
        cfg, topo = self.cfg, self.topology
        explicit = cfg.parallel.pipeline_config.layers_per_stage
        if explicit is None:
            return None
        if explicit == "auto":
            from ..pipeline.planner import auto_stage_plan
            plan = auto_stage_plan(cfg.to_dict(), rank=self.rank,
                                   output_dir=self.output_dir)
            _log(self.rank, f"layers_per_stage: auto -> {plan.counts} (stage_plan.json in {self.output_dir})")
            return plan.counts
        return [len(r) for r in topo.layer_ranges(int(cfg.model.model_config.num_layers), explicit)]

    def _parallelize_stage(self, chunk, s: int, mesh, ids: np.ndarray) -> None:
        """A pipeline stage takes ids (first stage) or hidden states, and labels on the last stage;
        hidden states arrive split over dp (and over tp along the sequence with SP)."""
        last = s == self.topology.stage_num - 1
        dpx = "dp" if self.dp > 1 else "None"
        if s == 0:
            parallelize(chunk, self.model_config, ids, mesh=mesh, rank=self.rank)
            return
        hidden = np.zeros(ids.shape + (self.model_config.hidden_size,), np.float32)
        h_layout = mesh(dpx, "tp" if self.model_config.sequence_parallel else "None", "None")
        samples, layouts = (hidden, ids), [h_layout, mesh(dpx, "None")]
        if not last:
            samples, layouts = samples[:1], layouts[:1]
        parallelize(chunk, self.model_config, *samples, mesh=mesh, rank=self.rank, input_layouts=layouts)

    def _apply_recompute(self, chunk) -> None:
        """recompute_config / swap_config as MindFormers writes them (see docs/recompute.md)."""
        rc, sc = dict(self.cfg.recompute_config), dict(self.cfg.swap_config)
        if not any(rc.get(k) for k in ("recompute", "select_recompute", "select_comm_recompute")) \
                and not sc.get("swap"):
            return
        from ..recompute import apply_mindformers
        try:
            rec, swp = apply_mindformers(chunk, rc, sc if sc.get("swap") else None)
        except ValueError as e:
            raise ConfigError([f"recompute_config / swap_config: {e}"]) from None
        if self.rank == 0:
            names = ", ".join(rec.names[:3]) + (", ..." if len(rec) > 3 else "")
            print(f"recompute: {len(rec)} Cells ({names})" + (f"; swap: {len(swp)} Cells" if swp is not None and
                                                               len(swp) else ""), flush=True)

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        oc, lc = cfg.optimizer, cfg.lr_schedule
        total = int(lc.total_steps) if int(lc.total_steps) > 0 else self.total_steps
        warmup = int(lc.warmup_steps) if lc.warmup_steps is not None else int(round(float(lc.warmup_ratio) * total))
        peak = float(lc.learning_rate if lc.learning_rate is not None else oc.learning_rate)
        try:
            self.lr = build_lr_schedule(lc.type, peak, warmup, total, float(lc.lr_end))
        except ValueError as e:
            raise ConfigError([f"lr_schedule = {lc.type} with warmup {warmup} of {total} steps: {e}"]) from None
        self.optimizer = AdamW(self.params, self.lr, betas=tuple(oc.betas), eps=float(oc.eps),
                               weight_decay=float(oc.weight_decay))
        self.reducer = GradientReducer(self.params)
        groups, axis_groups = [], {}
        if self.tp > 1:
            from ..sharding.dtensor import device_mesh_of
            axis_groups["tp"] = device_mesh_of(self.plan.mesh).get_group("tp")
            groups.append(axis_groups["tp"])
        self.pp_group = None
        if self.pp > 1:   # stages hold different parameters: their squared norms add up over pp
            from ..distributed.process_group import new_group
            self.pp_group = new_group(self.topology.pp_ranks)
            groups.append(self.pp_group)
        weights = replication_weights(self.params, axis_groups) if axis_groups else None
        max_norm = float(cfg.runner_config.max_grad_norm)
        self.clip = ClipGradNorm(max_norm if max_norm > 0 else math.inf, groups, weights)   # inf: norm only
        reducer, clip, optimizer, k = self.reducer, self.clip, self.optimizer, self.accumulate

        def update(grads):
            if k > 1:
                grads = tuple(g / k for g in grads)
            grads, norm = clip(reducer(grads))
            optimizer(grads)
            return norm

        jit = self.mode == 0
        if self.pp > 1:
            self._build_pipeline()
        if self.sharded_dp:
            self._build_hsdp_step(max_norm, groups[:1] if self.tp > 1 else [], weights)
            return
        if self.pp > 1:
            self.grads_of = self._pipeline_grads()
        else:
            grad_fn = ms.value_and_grad(self.model, None, self.params)
            if k == 1:       # the whole step as one function (one graph under jit)
                def step(ids, labels):
                    loss, grads = grad_fn(ids, labels)
                    return loss, update(grads)
                self.step_fn = ms.jit(step) if jit else step
                return
            self.grads_of = ms.jit(grad_fn) if jit else grad_fn
        self.update_fn = ms.jit(update) if jit else update
        self.step_fn = self._accumulating_step

    def _build_pipeline(self) -> None:
        """This rank's ``PipelineStage`` objects and the configured schedule over them."""
        from ..pipeline.runtime import PipelineStage
        topo = self.topology
        self.stages = [PipelineStage(chunk, s, topo.stage_num, pp_ranks=topo.pp_ranks,
                                     loss_in_cell=s == topo.stage_num - 1)
                       for chunk, s in zip(self.chunks, topo.stages)]
        self.schedule = build_schedule(self.cfg.parallel.pipeline_config.pipeline_scheduler, self.stages,
                                       self.micro_batch_num)

    def _shared_loss(self, loss):
        """The last stage's loss on every pipeline rank (for logging), zeros standing in elsewhere."""
        from ..distributed import comm
        loss = loss if loss is not None else ms.ops.zeros((), ms.float32)
        return comm.all_reduce(loss, "sum", self.pp_group)

    def _pipeline_grads(self):
        """``(ids, labels) -> (loss, grads)`` of one schedule run on this rank's stages; the loss
        (on the last stage's ranks) is shared with every pipeline rank for logging."""
        topo = self.topology
        first, last = 0 in topo.stages, topo.stage_num - 1 in topo.stages
        mode = "jit" if self.mode == 0 else "pynative"
        schedule, stages = self.schedule, self.stages

        def grads_of(ids, labels):
            loss = schedule.run(ids if first else None, labels if last else None, mode=mode)
            grads = tuple(g for st in stages for g in st.grads)
            return self._shared_loss(loss), grads
        return grads_of

    def _build_hsdp_step(self, max_norm: float, tp_groups, weights) -> None:
        """``parallel.enable_parallel_optimizer``: hsdp (ZeRO level from the ``hsdp`` block) over the
        data-parallel axis of the model's (or each stage's) sharding plan; it owns the gradient
        reduction, accumulation, clipping (tp and pp included) and the sharded AdamW update."""
        from ..hsdp import hsdp
        hc, mode = self.cfg.hsdp, "jit" if self.mode == 0 else "pynative"
        target = self.stages if self.pp > 1 else self.model
        try:
            # level3 gathers a decoder layer's weights as one unit (before its forward and its
            # backward); the embedding, final norm and output layer are units of their own
            cells = [c for t in (target if isinstance(target, list) else [target])
                     for c in ([t.cell] if hasattr(t, "cell") else [t])]
            pattern = "*decoder.layers.*"
            has_layers = any(fnmatch.fnmatchcase(n, pattern) for c in cells for n, _ in c.cells_and_names())
            units = [pattern] if (hc.optimizer_level == "level3" and has_layers) else None
            self.wrapped = hsdp(target, shard_size=int(hc.shard_size), threshold=float(hc.threshold),
                                optimizer_level=hc.optimizer_level, accumulate_grad_step=1 if self.pp > 1
                                else self.accumulate, units=units)
        except ValueError as e:
            raise ConfigError([f"hsdp = {dict(hc)}: {e}"]) from None
        clip = max_norm if max_norm > 0 else math.inf     # inf: the norm is still computed and logged
        if self.pp > 1:
            step = self.wrapped.train_step(self.schedule, self.optimizer, mode=mode, max_grad_norm=clip,
                                           norm_groups=tp_groups, norm_weights=weights)
            topo = self.topology
            first, last = 0 in topo.stages, topo.stage_num - 1 in topo.stages

            def pipeline_step(ids, labels):
                loss = step(ids if first else None, labels if last else None)
                return self._shared_loss(loss), step.grad_norm
            self.step_fn = pipeline_step
            return
        step = self.wrapped.train_step(self.model, self.optimizer, mode=mode, max_grad_norm=clip,
                                       norm_groups=tp_groups, norm_weights=weights)
        k = self.accumulate

        def micro_steps(ids, labels):     # hsdp accumulates: communication on the last micro-step only
            rows = ids.shape[0] // k
            for i in range(k):
                loss = step(ids[i * rows:(i + 1) * rows], labels[i * rows:(i + 1) * rows])
            return loss, step.grad_norm
        self.step_fn = micro_steps

    def _accumulating_step(self, ids, labels):
        """``gradient_accumulation_steps`` micro-steps (or schedule runs), gradients summed, then one
        update with their mean: the same step as one batch of all their rows."""
        k = self.accumulate
        rows = ids.shape[0] // k
        total, summed = 0.0, None
        for i in range(k):
            loss, grads = self.grads_of(ids[i * rows:(i + 1) * rows], labels[i * rows:(i + 1) * rows])
            total = total + loss
            summed = grads if summed is None else tuple(a + g for a, g in zip(summed, grads))
        # a plain tuple of Tensors is a constant to ms.jit: it would recompile at every step
        norm = self.update_fn(ms.mutable(summed) if self.mode == 0 else summed)
        return total / k, norm

    # ------------------------------------------------------------------ checkpoints
    def _callback(self, kind: str) -> Optional[Config]:
        found = [cb for cb in (self.cfg.callbacks or []) if cb.get("type") == kind]
        return found[-1] if found else None

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.output_dir, "checkpoint")

    def save(self, step: int) -> str:
        """Save weights, AdamW moments, this rank's data position and the step (collective)."""
        if self.sharded_dp:     # hsdp holds shards of the moments (and of the weights at level3): gather
            states = self.wrapped.full_optimizer_states(self.optimizer)
            opt = {"adam_m": {p.name: st[0] for p, st in zip(self.params, states)},
                   "adam_v": {p.name: st[1] for p, st in zip(self.params, states)}}
        else:
            opt = {"adam_m": {p.name: m.asnumpy() for p, m in zip(self.params, self.optimizer.moment1)},
                   "adam_v": {p.name: v.asnumpy() for p, v in zip(self.params, self.optimizer.moment2)}}
        trainer_state = {"step": step, "seed": int(self.cfg.seed), "data_parallel": self.dp,
                         "model_parallel": self.tp, "pipeline_stage": self.pp, "global_batch": self.global_batch,
                         "next_lr": self.lr.at(step), "tokenizer_file": os.path.abspath(self.tokenizer.vocab_file)}
        with self._full_weights():
            weights = {p.name: p.asnumpy() for p in self.params}
        path = save_checkpoint(self.checkpoint_dir, step, weights,
                               {p.name: p.mfc_layout for p in self.params}, optimizer_state=opt,
                               data_state=self.data.state_dict(), trainer_state=trainer_state,
                               rank=self.rank, world_size=self.world)
        cb = self._callback("CheckpointMonitor")
        if self.rank == 0 and cb is not None:
            self._prune(int(cb.get("keep_checkpoint_max", 5) or 5))
        return path

    def _full_weights(self):
        """Context in which every parameter holds its full local (tensor-parallel) value: hsdp level3
        gathers its shards and keeps what is set inside (a no-op otherwise)."""
        import contextlib
        wrapped = getattr(self, "wrapped", None)      # (built with the optimizer: not in predict mode)
        return wrapped.unsharded() if wrapped is not None else contextlib.nullcontext()

    def _prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` published steps (never the tracker's)."""
        latest = read_tracker(self.checkpoint_dir)
        steps = list_steps(self.checkpoint_dir)
        for step in steps[:max(len(steps) - keep, 0)]:
            if step != latest:
                shutil.rmtree(os.path.join(self.checkpoint_dir, f"step_{step}"), ignore_errors=True)

    def load(self, directory: str, resume: bool, step: Any = None) -> int:
        """Load weights (resharded to this job's layout) from a checkpoint directory, one of its
        ``step_<k>`` directories or a .safetensors file of full tensors; with ``resume`` also the
        AdamW moments, the step counter (hence the lr position) and the data position. Returns the
        step training continues from (0 without resume)."""
        self.setup()
        if step is None:
            root, step = resolve_checkpoint(directory)
        else:
            root = directory
        targets = {p.name: (tuple(p.mfc_global_shape), p.mfc_layout) for p in self.params}
        where = f"load_checkpoint = {directory!r}"
        try:
            if root == "file":
                values = shard_single_file(step, targets, self.rank, strict=False)
            else:
                values = load_checkpoint(root, targets, self.rank, step=step, strict=False)
            with self._full_weights():
                for p in self.params:    # set_data: ops.assign checks a sliced Parameter against its full
                    _set(p, values[p.name])  # shape once communication is initialised
            if not resume:
                _log(self.rank, f"loaded weights from {directory}" + ("" if root == "file" else f" (step {step})"))
                return 0
            if root == "file":
                raise ConfigError([f"{where}: a single file holds weights only; resume needs a checkpoint directory"])
            state = load_training_state(root, step)
            opt = load_optimizer_state(root, targets, self.rank, step=step)
        except CheckpointError as e:
            raise ConfigError([f"{where}: {e}"]) from None
        missing = [p.name for p in self.params if p.name not in opt.get("adam_m", {}) or p.name not in
                   opt.get("adam_v", {})]
        if missing:
            raise ConfigError([f"{where}: resume_training needs AdamW moments, missing for {missing[:5]}; "
                               "load weights only (resume_training: False)"])
        for p, m, v in zip(self.params, self.optimizer.moment1, self.optimizer.moment2):
            full_m, full_v = opt["adam_m"][p.name], opt["adam_v"][p.name]
            if self.sharded_dp:       # this rank's hsdp shard of the full moments
                full_m, full_v = self.wrapped.shard_of(p, full_m), self.wrapped.shard_of(p, full_v)
            _set(m, full_m)
            _set(v, full_v)
        trained = int((state.trainer_state or {}).get("step", state.step))
        _set(self.optimizer.global_step, np.array(trained, np.int32))
        self._restore_data(state, where)
        _log(self.rank, f"resumed from {root} step {trained}: {self.data.consumed_samples} samples consumed per "
                        f"data-parallel rank, next lr {self.lr.at(trained):.3e}")
        return trained

    def _restore_data(self, state, where: str) -> None:
        """This rank's data position from the saved ones: the state of a rank with the same data-parallel
        index when the data-parallel size is unchanged, else the same global position re-split."""
        saved = [s for s in state.data_states.values() if s]
        if not saved:
            raise ConfigError([f"{where}: the checkpoint has no data state; load weights only "
                               "(resume_training: False)"])
        dp_rank = self.topology.dp_rank
        same = [s for s in saved if s.get("dp_size") == self.dp and s.get("dp_rank") == dp_rank]
        if same:
            self.data.load_state_dict(same[0])
            return
        sizes = {(s.get("dp_size"), s.get("consumed_samples")) for s in saved}
        if len(sizes) != 1:
            raise ConfigError([f"{where}: saved data states disagree ({sorted(sizes)}); resume with the saved "
                               "layout"])
        old_dp, consumed = sizes.pop()
        num = int(saved[0].get("num_samples", -1))
        if num != self.data.num_samples:
            raise ConfigError([f"{where}: the checkpoint's data has {num} samples, this dataset "
                               f"{self.data.num_samples}; resume with the same data, tokenizer and seq_length"])
        epoch, pos = divmod(int(consumed), num // old_dp)
        if (pos * old_dp) % self.dp:
            raise ConfigError([f"{where}: the saved data position ({pos} samples on each of {old_dp} data-parallel "
                               f"ranks in epoch {epoch}) does not split over data_parallel = {self.dp}; resume "
                               f"with a data_parallel that divides {pos * old_dp}"])
        moved = dict(saved[0], dp_rank=dp_rank, dp_size=self.dp,
                     consumed_samples=epoch * self.data.samples_per_epoch + pos * old_dp // self.dp)
        self.data.load_state_dict(moved)

    def restore(self) -> int:
        """Load what the config asks for (load_checkpoint / resume_training); returns the start step."""
        src = self.checkpoint_source
        if src is None:
            return 0
        root, step, resume = src
        return self.load(root, resume, step=step)

    # ------------------------------------------------------------------ loop
    def _batches(self):
        """Local batches of this data-parallel rank; the dataset resumes from its consumed count."""
        it = iter(self.data)
        while True:
            rows = []
            while len(rows) < self.local_batch:
                sample = next(it, None)
                if sample is None:     # epoch boundary: the dataset continues with the next epoch
                    it = iter(self.data)
                    continue
                rows.append(sample)
            yield (np.stack([r[0] for r in rows]).astype(np.int32),
                   np.stack([r[1] for r in rows]).astype(np.int32))

    def _open_log(self, start: int) -> str:
        """The JSONL loss log; a fresh run truncates it, a resumed one keeps steps <= start."""
        monitor = self._callback("MFLossMonitor")
        path = (monitor.get("log_file") if monitor is not None else None) or os.path.join(self.output_dir,
                                                                                          "loss.jsonl")
        path = os.path.abspath(path)
        if self.rank == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            kept = []
            if start > 0 and os.path.exists(path):
                with open(path) as f:
                    kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= start]
            with open(path + ".tmp", "w") as f:
                f.writelines(kept)
            os.replace(path + ".tmp", path)
        return path

    def train(self) -> List[Dict[str, Any]]:
        """Train to ``total_steps``; returns this session's per-step records (as in loss.jsonl)."""
        cfg = self.cfg
        self.setup()
        start = self.start_step = self.restore()
        ckpt = self._callback("CheckpointMonitor")
        every = int(ckpt.get("save_checkpoint_steps", 0) or 0) if ckpt is not None else 0
        monitor = self._callback("MFLossMonitor")
        print_every = int(monitor.get("per_print_times", 1) or 1) if monitor is not None else 1
        evaluator = self._callback("EvalCallBack")
        eval_every = int(evaluator.get("eval_interval", 100) or 100) if evaluator is not None else 0
        n_params = sum(int(np.prod(p.mfc_global_shape)) for p in self.params)   # this pipeline rank's stages
        seq = int(cfg.model.model_config.seq_length)
        pipe = (f" pp={self.pp} ({self.cfg.parallel.pipeline_config.pipeline_scheduler}, "
                f"{self.topology.stage_num} stages, {self.micro_batch_num} microbatches)") if self.pp > 1 else ""
        accumulate = f", {self.accumulate} accumulation steps" if self.accumulate > 1 else ""
        _log(self.rank, f"llama: {n_params / 1e6:.2f}M parameters, dp={self.dp} tp={self.tp} "
                        f"sp={self.model_config.sequence_parallel}{pipe}{accumulate}, "
                        f"mode={'jit' if self.mode == 0 else 'pynative'}, "
                        f"steps {start + 1}..{self.total_steps} of {self.global_batch}x{seq} tokens, "
                        f"output in {self.output_dir}")
        log_path = self._open_log(start)
        history = []
        tokens_per_step = self.global_batch * seq
        batches = self._batches()
        timed, timed_steps = 0.0, 0          # wall time of steps after this session's first (compile, warm-up)
        last_saved = start
        for step in range(start, self.total_steps):
            t0 = time.monotonic()
            ids, labels = next(batches)
            t1 = time.monotonic()
            loss, norm = self.step_fn(Tensor(ids), Tensor(labels))
            loss, norm = float(loss), float(norm)
            t2 = time.monotonic()
            lr = self.lr.at(step)            # the rate this step used (AdamW takes lr(step index))
            if step > start:
                timed, timed_steps = timed + (t2 - t0), timed_steps + 1
            per_step = timed / timed_steps if timed_steps else (t2 - t0)
            eta = per_step * (self.total_steps - step - 1)
            record = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm,
                      "tokens_per_s": tokens_per_step / (t2 - t1), "step_time_s": t2 - t0}
            history.append(record)
            if self.rank == 0:
                if (step + 1) % print_every == 0 or step + 1 == self.total_steps or not math.isfinite(loss):
                    print(f"step {step + 1:>4}/{self.total_steps}  loss {loss:.4f}  lr {lr:.3e}  "
                          f"grad_norm {norm:.3f}  {tokens_per_step / (t2 - t1):,.0f} tok/s  "
                          f"ETA {eta:.0f}s", flush=True)
            if eval_every and (step + 1) % eval_every == 0:
                record["eval_loss"] = self.evaluate()
                _log(self.rank, f"step {step + 1:>4}/{self.total_steps}  eval_loss {record['eval_loss']:.4f}  "
                                f"({self.cfg.eval_dataset.eval_steps} batches of {self.cfg.eval_dataset.dataset_dir})")
            if self.rank == 0:
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {step + 1}: loss is {loss}")
            if every and (step + 1) % every == 0:
                self.save(step + 1)
                last_saved = step + 1
        if every and last_saved < self.total_steps:
            self.save(self.total_steps)
        return history

    # ------------------------------------------------------------------ predict
    def generate(self, ids: List[int], max_new_tokens: int = 32) -> List[int]:
        """Greedy continuation of token ids (single process); returns the new ids only."""
        if self.world != 1:
            raise ConfigError([f"run_mode = 'predict': runs on one process, not {self.world}"])
        seq = int(self.cfg.model.model_config.seq_length)
        ids, new = list(ids), []
        for _ in range(max_new_tokens):
            window = ids[-seq:]
            x = np.full((1, seq), self.tokenizer.pad_token_id, np.int32)
            x[0, :len(window)] = window
            logits = self.model(Tensor(x)).asnumpy()
            nxt = int(logits[0, len(window) - 1].argmax())
            ids.append(nxt)
            new.append(nxt)
            if nxt == self.tokenizer.eos_token_id:
                break
        return new

    def predict(self, prompt: str, max_new_tokens: int = 32) -> str:
        """The prompt followed by its greedy continuation, from the loaded weights (single process)."""
        self.setup()
        ids = [self.tokenizer.bos_token_id] + self.tokenizer.encode(prompt, add_bos=False)
        new = self.generate(ids, max_new_tokens)
        return self.tokenizer.decode(ids[1:] + new)
