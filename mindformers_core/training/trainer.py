"""The YAML-driven trainer behind ``run_mindformer.py``.

Order of construction (each step validated before the next, errors before any process group):
config → distributed init → tokenizer and data (each data-parallel rank its own slice) → model
(``research/llama``) → ``parallelize`` (tensor/sequence parallel from the layers' ``shard()``) →
optimizer (AdamW + lr schedule, global-norm clipping) → resume → train loop. The same loop runs
eagerly (``context.mode: 1``) or as one compiled step (``mode: 0``, ``ms.jit``).

Wired today: data parallel, tensor parallel, sequence parallel. ``pipeline_stage > 1`` and the
``hsdp`` block are validated but not yet wired into this trainer: it says so and stops.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from ..checkpoint import load_checkpoint, load_training_state, save_checkpoint
from ..checkpoint.load import load_optimizer_state
from ..data.corpus import build_corpus
from ..data.dataset import PackedDataset
from ..data.tokenizer import LlamaTokenizer, train_tokenizer
from ..distributed.env import get_env, init_distributed
from ..optim import AdamW, ClipGradNorm, build_lr_schedule, replication_weights
from ..sharding.parallelize import GradientReducer, parallelize
from .config import Config, ConfigError


def _log(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


def _wait_for(path: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for rank 0 to write {path}")
        time.sleep(0.5)


class Trainer:
    """``Trainer(config).train()``; ``config`` is a validated :class:`Config`."""

    def __init__(self, config: Config):
        self.cfg = config
        pc = config.parallel_config
        if int(pc.pipeline_stage) > 1:
            raise ConfigError("parallel_config.pipeline_stage="
                              f"{pc.pipeline_stage}: the pipeline runtime exists (mindformers_core.pipeline) but is "
                              "not wired into the trainer yet; use pipeline_stage: 1")
        if int(pc.context_parallel) > 1:
            raise ConfigError(f"parallel_config.context_parallel={pc.context_parallel}: context-parallel attention "
                              "is not implemented; use context_parallel: 1")
        self.dp, self.tp = int(pc.data_parallel), int(pc.model_parallel)
        self.output_dir = os.path.abspath(config.output_dir)
        self.mode = int(config.context.mode)

    # ------------------------------------------------------------------ build
    def setup(self) -> None:
        cfg = self.cfg
        ms.set_context(mode=ms.PYNATIVE_MODE)   # tracing for the plan is PyNative; jit wraps the step
        env = init_distributed() if cfg.use_parallel else get_env()
        self.rank, self.world = env.rank, env.world_size
        if self.dp * self.tp != self.world:
            raise ConfigError(f"parallel_config: data_parallel ({self.dp}) x model_parallel ({self.tp}) = "
                              f"{self.dp * self.tp} but {self.world} worker(s) are running")
        ms.set_seed(int(cfg.seed))
        np.random.seed(int(cfg.seed))
        os.makedirs(self.output_dir, exist_ok=True)
        self._build_data()
        self._build_model()
        self._build_optimizer()

    def _build_data(self) -> None:
        cfg, ds = self.cfg, self.cfg.train_dataset
        mc = cfg.model.model_config
        data_dir = ds.dataset_dir
        if not data_dir:
            data_dir = os.path.join(self.output_dir, "corpus.txt")
            if self.rank == 0 and not os.path.exists(data_dir):
                build_corpus(data_dir + ".tmp", max_bytes=2_000_000)
                os.replace(data_dir + ".tmp", data_dir)
            _wait_for(data_dir)
        files = [os.path.join(data_dir, f) for f in sorted(os.listdir(data_dir))] if os.path.isdir(data_dir) \
            else [data_dir]
        tok = ds.tokenizer_file
        if not tok:
            prefix = os.path.join(self.output_dir, f"tokenizer_{mc.vocab_size}")
            tok = prefix + ".model"
            if self.rank == 0 and not os.path.exists(tok):
                tmp = train_tokenizer(files, prefix + ".tmp", int(mc.vocab_size))
                os.replace(tmp, tok)
                os.replace(prefix + ".tmp.vocab", prefix + ".vocab")
            _wait_for(tok)
        self.tokenizer = LlamaTokenizer(tok)
        if self.tokenizer.vocab_size != int(mc.vocab_size):
            raise ConfigError(f"model.model_config.vocab_size={mc.vocab_size} but the tokenizer {tok} has "
                              f"{self.tokenizer.vocab_size} pieces")
        dp_rank = self.rank // self.tp
        cache = os.path.join(self.output_dir, "token_cache")
        ready = os.path.join(cache, f"ready_{os.path.basename(tok)}")
        if self.rank == 0:
            PackedDataset(files, self.tokenizer, int(mc.seq_length), cache_dir=cache)
            open(ready, "w").close()
        _wait_for(ready)
        self.data = PackedDataset(files, self.tokenizer, int(mc.seq_length), cache_dir=cache,
                                  seed=int(cfg.seed), shuffle=bool(ds.shuffle), dp_rank=dp_rank, dp_size=self.dp)
        self.global_batch = int(cfg.runner_config.batch_size) * self.dp
        self.local_batch = int(cfg.runner_config.batch_size)
        self.steps_per_epoch = self.data.samples_per_epoch // self.local_batch
        if self.steps_per_epoch < 1:
            raise ConfigError(f"runner_config.batch_size={self.local_batch}: each data-parallel rank has only "
                              f"{self.data.samples_per_epoch} samples of {mc.seq_length} tokens")
        limit = int(cfg.runner_config.get("max_steps", -1) or -1)
        self.total_steps = self.steps_per_epoch * int(cfg.runner_config.epochs)
        if limit > 0:
            self.total_steps = min(self.total_steps, int(limit))

    def _build_model(self) -> None:
        from research.llama.llama import LlamaConfig, LlamaForCausalLM
        cfg = self.cfg
        pc = dict(cfg.parallel_config)
        self.model_config = LlamaConfig.from_model_config(cfg.model.model_config, pc)
        self.model_config.data_parallel_size = self.dp
        self.model_config.tensor_model_parallel_size = self.tp
        self.model_config.sequence_parallel = bool(pc.get("use_seq_parallel", False)) and self.tp > 1
        ms.set_seed(int(cfg.seed))
        self.model = LlamaForCausalLM(self.model_config)
        seq = int(cfg.model.model_config.seq_length)
        sample = np.zeros((self.global_batch, seq), np.int32)
        parallelize(self.model, self.model_config, sample, sample, rank=self.rank)
        self.plan = self.model.mfc_sharding_plan
        self.input_layout = self.plan.input_layouts[0]
        self.params = self.model.trainable_params()

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        oc, lc = cfg.optimizer, cfg.lr_schedule
        total = int(lc.total_steps) if int(lc.total_steps) > 0 else self.total_steps
        warmup = int(round(float(lc.warmup_ratio) * total))
        self.lr = build_lr_schedule(lc.type, float(lc.learning_rate), warmup, total, float(lc.lr_end))
        self.optimizer = AdamW(self.params, self.lr, betas=tuple(oc.betas), eps=float(oc.eps),
                               weight_decay=float(oc.weight_decay))
        self.reducer = GradientReducer(self.params)
        tp_group = None
        groups = []
        if self.tp > 1:
            from ..sharding.dtensor import mesh_of
            tp_group = mesh_of(self.plan.mesh).get_group("tp")
            groups = [tp_group]
        weights = replication_weights(self.params, {"tp": tp_group}) if tp_group is not None else None
        self.clip = ClipGradNorm(float(cfg.runner_config.get("max_grad_norm", 1.0) or 1e9), groups, weights)
        grad_fn = ms.value_and_grad(self.model, None, self.params)
        reducer, clip, optimizer = self.reducer, self.clip, self.optimizer

        def step(ids, labels):
            loss, grads = grad_fn(ids, labels)
            grads, norm = clip(reducer(grads))
            optimizer(grads)
            return loss, norm

        self.step_fn = ms.jit(step) if self.mode == 0 else step

    # ------------------------------------------------------------------ checkpoints
    def _layouts(self):
        return {p.name: p.mfc_layout for p in self.params}

    def save(self, step: int) -> str:
        opt = {"adam_m": {p.name: m.asnumpy() for p, m in zip(self.params, self.optimizer.moment1)},
               "adam_v": {p.name: v.asnumpy() for p, v in zip(self.params, self.optimizer.moment2)}}
        return save_checkpoint(os.path.join(self.output_dir, "checkpoint"), step,
                               {p.name: p.asnumpy() for p in self.params}, self._layouts(),
                               optimizer_state=opt, data_state=self.data.state_dict(),
                               trainer_state={"step": step, "seed": int(self.cfg.seed)},
                               rank=self.rank, world_size=self.world)

    def load(self, directory: str, resume: bool) -> int:
        targets = {p.name: (tuple(p.mfc_global_shape), p.mfc_layout) for p in self.params}
        values = load_checkpoint(directory, targets, self.rank, strict=False)
        for p in self.params:
            ms.ops.assign(p, Tensor(values[p.name]))
        if not resume:
            return 0
        state = load_training_state(directory)
        opt = load_optimizer_state(directory, targets, self.rank)
        for p, m, v in zip(self.params, self.optimizer.moment1, self.optimizer.moment2):
            ms.ops.assign(m, Tensor(opt["adam_m"][p.name]))
            ms.ops.assign(v, Tensor(opt["adam_v"][p.name]))
        step = int(state.trainer_state["step"])
        ms.ops.assign(self.optimizer.global_step, Tensor(np.array(step, np.int32)))
        states = state.data_states
        mine = states.get(self.rank, states.get(str(self.rank)))
        if mine is None:
            raise ConfigError(f"resume_training: the checkpoint in {directory} has no data state for rank "
                              f"{self.rank} (saved on {state.world_size} workers); resume with the same layout or "
                              f"load weights only (resume_training: False)")
        self.data.load_state_dict(mine)
        return step

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

    def train(self) -> List[Dict[str, Any]]:
        cfg = self.cfg
        self.setup()
        start = 0
        ckpt_dir = os.path.join(self.output_dir, "checkpoint")
        if cfg.load_checkpoint:
            start = self.load(cfg.load_checkpoint, bool(cfg.resume_training))
        elif cfg.resume_training and os.path.exists(os.path.join(ckpt_dir, "latest_checkpointed_iteration.txt")):
            start = self.load(ckpt_dir, True)
        every = 0
        for cb in cfg.callbacks or []:
            if cb.get("type") == "CheckpointMonitor":
                every = int(cb.get("save_checkpoint_steps", 0) or 0)
        n_params = sum(int(np.prod(p.mfc_global_shape)) for p in self.params)
        _log(self.rank, f"llama: {n_params / 1e6:.2f}M parameters, dp={self.dp} tp={self.tp} "
                        f"sp={self.model_config.sequence_parallel}, mode={'jit' if self.mode == 0 else 'pynative'}, "
                        f"{self.total_steps} steps of {self.global_batch}x{self.cfg.model.model_config.seq_length} tokens")
        log_path = os.path.join(self.output_dir, "loss.jsonl")
        history = []
        seq = int(cfg.model.model_config.seq_length)
        tokens_per_step = self.global_batch * seq
        t_start = time.monotonic()
        batches = self._batches()
        for step in range(start, self.total_steps):
            ids, labels = next(batches)
            t0 = time.monotonic()
            loss, norm = self.step_fn(Tensor(ids), Tensor(labels))
            loss, norm = float(loss), float(norm)
            dt = time.monotonic() - t0
            lr = float(self.lr(Tensor(np.array(step, np.int32))))
            done = step + 1 - start
            eta = (time.monotonic() - t_start) / done * (self.total_steps - step - 1)
            record = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm,
                      "tokens_per_s": tokens_per_step / dt, "step_time_s": dt}
            history.append(record)
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {step + 1}: loss is {loss}")
            if self.rank == 0:
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"step {step + 1:>4}/{self.total_steps}  loss {loss:.4f}  lr {lr:.2e}  grad_norm {norm:.3f}  "
                      f"{tokens_per_step / dt:,.0f} tok/s  ETA {eta:.0f}s", flush=True)
            if every and (step + 1) % every == 0:
                self.save(step + 1)
        if every and self.total_steps % every:
            self.save(self.total_steps)
        return history

    # ------------------------------------------------------------------ predict
    def predict(self, prompt: str, max_new_tokens: int = 32) -> str:
        """Greedy generation from the loaded weights (single process)."""
        if self.world != 1:
            raise ConfigError("run_mode=predict runs on one process (use_parallel: False)")
        ids = [self.tokenizer.bos_token_id] + self.tokenizer.encode(prompt)
        seq = int(self.cfg.model.model_config.seq_length)
        for _ in range(max_new_tokens):
            window = ids[-seq:]
            x = np.full((self.global_batch, seq), self.tokenizer.pad_token_id, np.int32)
            x[:, :len(window)] = window
            logits = self.model(Tensor(x)).asnumpy()
            nxt = int(logits[0, len(window) - 1].argmax())
            ids.append(nxt)
            if nxt == self.tokenizer.eos_token_id:
                break
        return self.tokenizer.decode(ids[1:])
