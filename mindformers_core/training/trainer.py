"""The YAML-driven trainer behind ``run_mindformer.py``: wiring and the training loop.

Order of construction (errors as early as possible):

1. ``Trainer(config)``: the trainer's own checks (``preflight``: files, tokenizer vocabulary,
   checkpoint to load, pipeline schedule, model class) — before any process group exists, as one
   :class:`ConfigError`.
2. ``setup()``: distributed init → where this rank sits (``topology``) → tokenizer and data
   (``inputs``) → the registered model, or this rank's pipeline stages of it, sharded and with
   recompute applied (``model_builder``) → optimizer and the step function (``steps``).
3. ``train()``: load/resume (``checkpointing``) → loop. The same loop runs eagerly
   (``context.mode: 1``) or compiled (``mode: 0``).

``predict_all()`` (``run_mode: predict``) generates on one process or tensor parallel under msrun;
``predict()``/``generate()`` on one process (``predict``). The parallel
optimizer runs as hsdp; ``context_parallel > 1`` is refused. See docs/quickstart.md.
"""
from __future__ import annotations

import math
import os
import signal
import time
from typing import Any, Dict, List, Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor

from ..common.batch import model_args
from ..distributed.env import get_env, init_distributed
from ..models import get_model_spec
from ..sharding.annotations import global_shape_of
from .checkpointing import Checkpointer, lora_checkpoint_args, state_params_of
from .config import Config, ConfigError
from .faults import FaultInjector
from .heartbeat import Heartbeat
from .inputs import build_inputs, hf_rows, launch_rank
from .model_builder import build_model
from .mtp_log import combined
from .monitoring import TensorBoardLog, write_loss_svg
from ..generation import GenerationConfig
from .predict import check_batch_size, complete, generate, generation_config, read_prompts, run_predict
from .preflight import callback, preflight
from .shape import JobShape
from .step_log import StepLog
from .steps import build_train_step, relax_actor_threads
from .topology import Topology


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many bad steps in a row); the message says why and what to do."""


class Trainer:
    """``Trainer(config).train()``; ``config`` is a validated :class:`Config`.

    ``worker_num`` is the number of workers the job runs on (msrun ``--worker_num``); by default the
    ``MS_WORKER_NUM`` msrun exports, else 1. The constructor raises :class:`ConfigError` for
    everything the trainer can check without a process group.
    """

    def __init__(self, config: Config, worker_num: Optional[int] = None):
        self.cfg = config
        self.shape = JobShape.from_config(config)
        self.output_dir = os.path.abspath(config.output_dir)
        self.worker_num = int(os.environ.get("MS_WORKER_NUM", "1")) if worker_num is None else int(worker_num)
        self.found = preflight(config, self.shape, self.worker_num, self.output_dir)
        self.tokenizer_file = self.found.tokenizer_file
        # HFDataLoader rows: made (and their records accounted for, or the data refused) before any process group
        self.sft = None
        if not self.shape.predicting and config.train_dataset.type == "hf":
            self.sft = hf_rows(config, self.found, self.output_dir)
            if launch_rank() == 0:
                for line in self.sft.lines():
                    print(line, flush=True)
        self.start_step = 0
        self._ready = False
        self._loaded_in_setup = False    # setup() loaded the Hugging Face folder whose weights it did not draw

    def log(self, text: str) -> None:
        """Print on rank 0 only."""
        if self.rank == 0:
            print(text, flush=True)

    # ------------------------------------------------------------------ build
    def setup(self) -> None:
        """Distributed init, data, model, optimizer (predict: tokenizer and model only). Idempotent."""
        if self._ready:
            return
        cfg, shape = self.cfg, self.shape
        ms.set_context(mode=ms.PYNATIVE_MODE)   # tracing for the plan is PyNative; jit wraps the step
        env = init_distributed() if cfg.use_parallel else get_env()
        self.rank, self.world = env.rank, env.world_size
        problem = shape.world_problem(self.world, "the running worker count")
        if problem:
            raise ConfigError([problem])
        self.topology = Topology(self.rank, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler,
                                 order=shape.rank_order, cp=shape.cp)
        for w in self.found.warnings:
            self.log(w)
        ms.set_seed(int(cfg.seed))
        np.random.seed(int(cfg.seed))
        os.makedirs(self.output_dir, exist_ok=True)
        ckpt = callback(cfg, "CheckpointMonitor")
        keep = int(ckpt.get("keep_checkpoint_max", 5) or 5) if ckpt is not None else None
        common = dict(directory=self.checkpoint_dir, rank=self.rank, world=self.world, dp=shape.dp,
                      dp_rank=self.topology.dp_rank, keep=keep, log=self.log,
                      async_save=bool(ckpt is not None and ckpt.get("async_save")),
                      fallback=bool(cfg.get("resume_fallback_to_intact", False)),
                      hf_adapter=get_model_spec(cfg.model.arch.type).state_dict_adapter,
                      mf_adapter=self._mindformers_table)
        if shape.predicting:
            from ..data.tokenizer import build_tokenizer
            self.tokenizer = build_tokenizer(self.found.tokenizer_kind, self.tokenizer_file)
            self.global_batch = 1
            self._build_model(micro_batch=1)
            self.checkpointer = Checkpointer(params=self.params, state_params=state_params_of(self.built.chunks),
                                             **lora_checkpoint_args(cfg, self.built.chunks), **common)
        else:
            self.inputs = build_inputs(cfg, shape, self.found, self.rank, self.topology.dp_rank, self.output_dir,
                                       cp_rank=self.topology.cp_rank, sft=self.sft)
            self.tokenizer, self.data = self.inputs.tokenizer, self.inputs.data
            self.global_batch, self.total_steps = self.inputs.global_batch, self.inputs.total_steps
            self._build_model(self.inputs.micro_batch)
            self.faults = FaultInjector(self.rank)
            nan = any(f.kind == "nan" for f in self.faults.faults)
            if nan and shape.sharded_dp:
                raise ConfigError(["MFC_FAULT: 'nan' faults are injected into our gradient update, which hsdp "
                                   "(parallel.enable_parallel_optimizer) replaces; use exit/hang faults there"])
            step = build_train_step(cfg, shape, self.topology, self.built, self.total_steps, inject_nan=nan)
            self.step_fn, self.optimizer, self.lr, self.wrapped = step.step_fn, step.optimizer, step.lr, step.wrapped
            self.guard, self._poison = step.guard, step.poison
            self.checkpointer = Checkpointer(params=self.params, optimizer=self.optimizer, wrapped=self.wrapped,
                                             data=self.data, state_params=state_params_of(self.built.chunks),
                                             copies=self.built.copies, **lora_checkpoint_args(cfg, self.built.chunks),
                                             **common)
        folder = self._hf_folder()
        if folder is not None:      # the weights the build left as zeros: filled before anything can use them
            self.checkpointer.load("hf", False, step=folder)
            self._loaded_in_setup = True
        self._ready = True

    def _mindformers_table(self, ckpt):
        """The MindFormers name table for reading ``ckpt`` (an opened MindFormers checkpoint) into this model: the
        scheme its names use, the fused layouts the YAML's model_config keys give (MindFormers' defaults)."""
        from ..models.mindformers.load import checkpoint_adapter
        spec = get_model_spec(self.cfg.model.arch.type)
        return checkpoint_adapter(ckpt, spec.model_type, self.model_config, self.cfg.model.model_config.to_dict())

    def _hf_folder(self) -> Optional[str]:
        """The Hugging Face folder the run loads its weights from (``load_checkpoint``, not resumed), or None."""
        src = self.found.checkpoint_source
        return src[1] if src is not None and src[0] == "hf" and not src[2] else None

    def _build_model(self, micro_batch: int) -> None:
        # weights a Hugging Face folder overwrites are not drawn (20-40 s at Qwen3-0.6B's size): setup() loads
        # the folder right after (model_builder.build_model's ``hf_folder``)
        self.built = build_model(self.cfg, self.shape, self.topology, micro_batch, self.output_dir, self.log,
                                 hf_folder=self._hf_folder())
        self.model_config, self.model, self.params = self.built.model_config, self.built.model, self.built.params

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.output_dir, "checkpoint")

    def save(self, step: int) -> str:
        """Save weights, AdamW moments, this rank's data position and the step (collective)."""
        shape = self.shape
        applied = int(self.optimizer.global_step.asnumpy())     # fewer than ``step`` after skipped steps
        state = {"step": step, "optimizer_step": applied, "seed": int(self.cfg.seed), "data_parallel": shape.dp,
                 "model_parallel": shape.tp, "pipeline_stage": shape.pp, "global_batch": self.global_batch,
                 "next_lr": self.lr.at(applied),
                 "tokenizer_file": os.path.abspath(self.tokenizer.vocab_file)}
        return self.checkpointer.save(step, state)

    def load(self, directory: str, resume: bool, step: Any = None) -> int:
        """Load a checkpoint (see :meth:`Checkpointer.load`); returns the step training continues from."""
        self.setup()
        trained = self.checkpointer.load(directory, resume, step)
        if resume:
            applied = int(self.optimizer.global_step.asnumpy())
            self.log(f"resumed from {directory} step {trained}: {self.data.consumed_samples} samples consumed per "
                     f"data-parallel rank, next lr {self.lr.at(applied):.3e}")
        return trained

    def restore(self) -> int:
        """Load what the config asks for (load_checkpoint / resume_training); returns the start step."""
        src = self.found.checkpoint_source
        if src is None:
            return 0
        if self._loaded_in_setup:      # the Hugging Face folder setup() loaded already (weights only: step 0)
            self._loaded_in_setup = False
            return 0
        root, step, resume = src
        return self.load(root, resume, step=step)

    # ------------------------------------------------------------------ loop
    def evaluate(self) -> float:
        """Mean loss over the first ``eval_dataset.eval_steps`` batches of the held-out data (the
        same batches every time), forward only, eagerly, dropout off."""
        steps = int(self.cfg.eval_dataset.eval_steps)
        was_training = self.model.training
        self.model.set_train(False)
        total = 0.0
        try:
            with self.checkpointer.full_weights():
                for batch in self.inputs.eval_batches(steps):
                    total += float(self.model(*model_args(batch, Tensor)).asnumpy())
        finally:
            self.model.set_train(was_training)
        return total / steps

    def _banner(self, start: int) -> str:
        shape, cfg = self.shape, self.cfg
        n_params = sum(int(np.prod(global_shape_of(p))) for p in self.params)   # this pipeline rank's stages
        pipe = (f" pp={shape.pp} ({shape.scheduler}, {self.topology.stage_num} stages, {shape.micro_batch_num} "
                f"microbatches)") if shape.pp > 1 else ""
        accumulate = f", {shape.accumulate} accumulation steps" if shape.accumulate > 1 else ""
        return (f"{cfg.model.arch.type}: {n_params / 1e6:.2f}M parameters, dp={shape.dp} tp={shape.tp} "
                f"sp={self.model_config.sequence_parallel}{pipe}{accumulate}, mode={shape.mode_name}, "
                f"steps {start + 1}..{self.total_steps} of {self.global_batch}x{cfg.model.model_config.seq_length} "
                f"tokens, output in {self.output_dir}")

    def train(self) -> List[Dict[str, Any]]:
        """Train to ``total_steps``; returns this session's per-step records (as in loss.jsonl)."""
        cfg = self.cfg
        self.setup()
        # MindSpore's PyNative op-queue threads swap in a SIGINT handler that sends SIGTERM when they start
        # (in setup); Python's handler back gives KeyboardInterrupt in PyNative when called as a library. A
        # program (run_mindformer.py) goes through training.signals, which also covers jit graph launches.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        start = self.start_step = self.restore()
        # under the supervisor (--max_restarts, MAX_RESTARTS): a beat per step tells it who is alive
        beat = Heartbeat(self.output_dir, self.rank).beat if os.environ.get("MFC_SUPERVISED") else (lambda *a: None)
        beat(start)
        if start == 0 and cfg.get("overwrite_output_dir") and self.rank == 0:
            self.checkpointer.clear()        # the earlier run's steps must not mix with this one's
        ckpt = callback(cfg, "CheckpointMonitor")
        every = int(ckpt.get("save_checkpoint_steps", 0) or 0) if ckpt is not None else 0
        monitor = callback(cfg, "MFLossMonitor")
        evaluator = callback(cfg, "EvalCallBack")
        eval_every = int(evaluator.get("eval_interval", 100) or 100) if evaluator is not None else 0
        self.log(self._banner(start))
        steps = StepLog((monitor.get("log_file") if monitor is not None else None)
                        or os.path.join(self.output_dir, "loss.jsonl"), self.rank, start, self.total_steps,
                        self.global_batch * int(cfg.model.model_config.seq_length),
                        int(monitor.get("per_print_times", 1) or 1) if monitor is not None else 1, self.log,
                        extra=combined(self.built.moe, self.built.mtp))
        board = TensorBoardLog.from_config(cfg, self.rank)     # rank 0 only; no-op without tensorboard_dir
        history, batches, last_saved = [], self.inputs.batches(), start
        applied = int(self.optimizer.global_step.asnumpy())   # optimizer steps taken (skipped steps excluded)
        limit, in_a_row = int(cfg.runner_config.get("max_consecutive_skipped_steps", 5)), 0
        relax = not self.shape.jit
        if relax:
            relax_actor_threads()
        try:
            for step in range(start + 1, self.total_steps + 1):      # 1-based, as logged
                self.faults.before_step(step)
                poisoned = self._poison is not None and self.faults.nan_at(step)
                if poisoned:
                    ms.ops.assign(self._poison, Tensor(float("nan"), ms.float32))
                t0 = time.monotonic()
                drawn = self.inputs.position()
                batch = next(batches)
                t1 = time.monotonic()
                # a global batch without a target token (every rank counts it alike, from the data): nothing to
                # learn from, so no step runs (loss 0, weights and moments untouched); logged, not a fault
                empty = self.inputs.global_targets(drawn) == 0
                if empty:
                    loss, norm = 0.0, None
                else:
                    loss, norm = self.step_fn(*model_args(batch, Tensor))
                    loss, norm = float(loss), None if norm is None else float(norm)   # None: log_grad_norm off
                if relax:
                    relax_actor_threads()     # PyNative: no spinning actor threads (steps.relax_actor_threads)
                t2 = time.monotonic()
                if poisoned:
                    ms.ops.assign(self._poison, Tensor(1.0, ms.float32))
                lr = self.lr.at(applied)          # the rate this step used (AdamW takes lr(optimizer step))
                skipped = not empty and self.guard is not None and not self.guard.is_ok(norm)
                applied = applied + (not skipped and not empty)
                in_a_row = in_a_row if empty else in_a_row + 1 if skipped else 0    # an empty batch is no fault
                record = steps.step(step, loss, norm, lr, t0, t1, t2, skipped and
                                    f"{self.guard.describe()}; {in_a_row} in a row", empty=empty)
                history.append(record)
                if eval_every and step % eval_every == 0:
                    record["eval_loss"] = self.evaluate()
                    self.log(f"step {step:>4}/{self.total_steps}  eval_loss {record['eval_loss']:.4f}  "
                             f"({cfg.eval_dataset.eval_steps} batches of {cfg.eval_dataset.dataset_dir})")
                steps.write(record)
                board.write(record)
                beat(step)
                if in_a_row >= limit:
                    beat(step, "stopped")
                    raise TrainingError(f"step {step}: {in_a_row} steps in a row skipped ({self.guard.describe()}; "
                                        f"runner_config.max_consecutive_skipped_steps = {limit}); the weights are "
                                        f"those of step {step - in_a_row}. Lower the learning rate or check the data, "
                                        "then resume from the last checkpoint")
                if not skipped and not (math.isfinite(loss) and (norm is None or math.isfinite(norm))):
                    beat(step, "stopped")
                    raise TrainingError(f"step {step}: loss {loss}, gradient norm {norm}, and runner_config."
                                        "use_skip_step_on_nan is off, so the update was applied and nothing after "
                                        f"step {last_saved} is saved; set use_skip_step_on_nan: True to skip such steps")
                if every and step % every == 0:
                    self.save(step)
                    last_saved = step
        finally:
            self.checkpointer.wait()         # a save in flight is part of the run, even a stopped one
            board.close()
            self._draw_loss(steps.path, board)
        if every and last_saved < self.total_steps:
            self.save(self.total_steps)
        self.checkpointer.wait()
        beat(self.total_steps, "done")
        return history

    def _draw_loss(self, jsonl: str, board: TensorBoardLog) -> None:
        """The loss curve next to loss.jsonl (rank 0), and where to look."""
        if self.rank != 0:
            return
        svg = write_loss_svg(jsonl)
        if svg:
            self.log(f"loss curve: {svg}" + (f"; TensorBoard: tensorboard --logdir {board.directory}"
                                             if board.directory else ""))

    def _last_step_saved_for_export(self) -> bool:
        """Collective: a checkpoint of the last step on disk (saved now if there is none); True on the rank that
        writes exports (rank 0)."""
        from ..checkpoint.format import read_tracker
        self.checkpointer.wait()
        if read_tracker(self.checkpoint_dir) != self.total_steps:
            self.save(self.total_steps)
            self.checkpointer.wait()
        return self.rank == 0

    def export_hf(self, out: str) -> Optional[str]:
        """Write the trained model as a Hugging Face folder (collective: a checkpoint of the last step is
        saved if there is none, then rank 0 merges it and writes ``out``)."""
        from .export_hf import export_checkpoint
        if not self._last_step_saved_for_export():
            return None
        path = export_checkpoint(self.cfg, self.checkpoint_dir, out, step=self.total_steps, log=self.log)
        if self.checkpointer.frozen:       # LoRA: the adapters also as a PEFT adapter folder beside it
            from ..peft.export import PeftFormatError
            from .export_hf import export_peft
            try:
                export_peft(self.cfg, self.checkpoint_dir, out.rstrip("/") + "_peft", step=self.total_steps,
                            log=self.log)
            except PeftFormatError as e:
                self.log(f"WARNING: no PEFT adapter folder written: {e}")
        return path

    def export_mf(self, out: str) -> Optional[str]:
        """Write the trained model as a MindFormers checkpoint (collective, as :meth:`export_hf`: a checkpoint of
        the last step is saved if there is none, then rank 0 merges it and writes ``out``)."""
        from .export_mf import export_checkpoint
        if not self._last_step_saved_for_export():
            return None
        return export_checkpoint(self.cfg, self.checkpoint_dir, out, step=self.total_steps,
                                 model_config=self.model_config, log=self.log)

    # ------------------------------------------------------------------ predict
    def generate(self, ids: List[int], max_new_tokens: int = 32) -> List[int]:
        """The continuation of token ids (single process, KV cache; greedy unless the generation config
        samples); returns the new ids only."""
        self._one_process()
        config, positions = self.generation_setup({"max_new_tokens": max_new_tokens})
        return generate(self.model, self.tokenizer, int(self.cfg.model.model_config.seq_length), ids,
                        max_new_tokens, jit=self.shape.jit, config=config, max_positions=positions)

    def predict(self, prompt: str, max_new_tokens: int = 32) -> str:
        """The prompt followed by its continuation, from the loaded weights (single process)."""
        self.setup()
        self._one_process()
        config, positions = self.generation_setup({"max_new_tokens": max_new_tokens})
        return complete(self.model, self.tokenizer, int(self.cfg.model.model_config.seq_length), prompt,
                        max_new_tokens, jit=self.shape.jit, config=config, max_positions=positions)

    def generation_setup(self, flags: Optional[dict] = None):
        """(GenerationConfig, the model's maximum sequence or None): the model folder's generation_config.json
        and max_position_embeddings (pretrained_model_dir), the YAML's generation keys, then ``flags``."""
        from ..models.hf.config import read_hf_config
        model_config = dict(self.cfg.model.model_config)
        folder_generation, positions = None, model_config.get("max_position_embeddings")
        folder = self.cfg.get("pretrained_model_dir")
        if folder:
            _, hf_config, folder_generation = read_hf_config(folder)
            positions = hf_config.get("max_position_embeddings") or positions
        config = generation_config(self.tokenizer, folder_generation, model_config, dict(flags or {}),
                                   seed=int(self.cfg.seed))
        return config, (int(positions) if positions else None)

    def check_predict(self, predict_data, batch_size: int = 1, flags: Optional[dict] = None) -> list:
        """The prompts, after checking them, the batch size (over dp) and the generation flags: before any
        process group or model exists."""
        try:
            prompts = read_prompts(predict_data)
            check_batch_size(batch_size, self.shape.dp)
            GenerationConfig.from_dict(flags)              # bad flag values named before the model is built
        except ValueError as e:
            raise ConfigError([str(e)]) from None
        return prompts

    def predict_all(self, predict_data, batch_size: int = 1, flags: Optional[dict] = None):
        """``run_mode: predict``: every prompt of ``predict_data`` (strings or a file) in batches, texts to the
        console, ``predict_results.jsonl`` in the output directory, tokens/s (training/predict.py). Under msrun
        (model_parallel > 1) every rank runs the generation step sharded over tp (its KV-cache slice); rank 0
        prints and writes the results."""
        prompts = self.check_predict(predict_data, batch_size, flags)
        self.setup()
        parallel = self.built.model_config if self.world > 1 else None
        quiet = None if self.rank == 0 else open(os.devnull, "w")
        try:
            config, positions = self.generation_setup(flags)
            return run_predict(self.model, self.tokenizer, prompts, config, batch_size, jit=self.shape.jit,
                               max_positions=positions, output_dir=self.output_dir if self.rank == 0 else None,
                               out=quiet, log=None if self.rank == 0 else (lambda text: None),
                               parallel_config=parallel)
        except ValueError as e:
            raise ConfigError([str(e)]) from None
        finally:
            if quiet is not None:
                quiet.close()

    def _one_process(self) -> None:
        if self.world != 1:
            raise ConfigError([f"run_mode = 'predict': runs on one process, not {self.world}"])
