"""The trainer's checkpoints: save (weights, AdamW moments, each rank's data position, the step),
load resharded to this job's layout, resume, keep the newest ``keep_checkpoint_max``.

Writes are atomic (``checkpoint.save_checkpoint`` publishes a step by renaming it, then moves the
tracker) and refuse non-finite values; what interrupted saves left behind is removed when the
trainer starts and after each prune. A corrupt step (checksums, missing files) is reported with
the newest intact step to load instead. A resume with another data-parallel size re-splits the
saved global data position.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor

from ..checkpoint import (AsyncSaver, CheckpointError, checkpoint_specs, list_steps, load_checkpoint,
                          load_optimizer_state, load_training_state, newest_intact_step, remove_leftovers, resolve_step,
                          save_checkpoint, shard_single_file, verify_step)
from ..checkpoint.format import TRACKER, read_tracker
from ..models.hf.loader import HFWeights, fill_parameter
from ..models.mtp_names import OURS as MTP_NAME
from ..sharding.annotations import global_shape_of, layout_of
from .config import ConfigError
from .preflight import resolve_checkpoint


def set_parameter(param, value: np.ndarray) -> None:
    """Overwrite a Parameter in place (same object: value_and_grad and the optimizer hold it)."""
    value = np.asarray(value)
    if tuple(param.shape) != value.shape:
        raise ValueError(f"{param.name}: checkpoint slice has shape {value.shape}, the parameter {tuple(param.shape)}")
    param.set_data(Tensor(value.astype(ms.dtype_to_nptype(param.dtype), copy=False)))


def _intact_hint(root: str, step, resume: bool) -> str:
    """Where to go when a step cannot be loaded: the newest older step that verifies."""
    if root == "file":
        return ""
    try:
        number = resolve_step(root, step)
    except (CheckpointError, ValueError):
        number = None
    intact = newest_intact_step(root, below=number)
    if intact is None:
        return f"\n  no older intact step in {root}"
    flag = f"--resume_training step_{intact}" if resume else f"--load_checkpoint {os.path.join(root, f'step_{intact}')}"
    return (f"\n  step_{intact} in {root} is intact: load it with {flag} (or set resume_fallback_to_intact: "
            "True to load it automatically)")


def state_params_of(chunks) -> List:
    """Non-trainable Parameters that are model state a run needs back: each MoE router's expert bias
    (``moe_router_enable_expert_bias``: moved after every step outside the gradient, it steers the
    routing). Saved beside the weights under their parameter names, with their layouts."""
    from ..transformer.moe import routers_of
    return [router.expert_bias for chunk in chunks for _, router in routers_of(chunk) if router.use_bias]


def lora_checkpoint_args(cfg, chunks) -> Dict[str, Any]:
    """Checkpointer arguments of a LoRA run (none without LoRA): the frozen base parameters and where their
    values come from when a checkpoint holds adapters only (``pretrained_model_dir`` or the HF folder /
    checkpoint given as ``load_checkpoint``)."""
    from ..peft import frozen_params
    frozen = frozen_params(chunks)
    if not frozen:
        return {}
    from .export_hf import lora_base_source
    return {"frozen": frozen, "base_source": lora_base_source(cfg)}


def _saved_names(root: str, step, adapter=None, candidates=()) -> set:
    """Names of the parameters a checkpoint step (or a single file, ``root == "file"``, or a Hugging Face
    folder, ``root == "hf"``, read through the family's ``adapter``; or a MindFormers checkpoint, ``root == "mf"``,
    ``adapter`` = (the opened checkpoint, its table): which of ``candidates``) holds."""
    if root == "mf":         # a fused MindFormers tensor holds several of ours: every source present
        held = set(adapter[0].tensors)
        out = set()
        for name in candidates:
            try:
                if set(adapter[1].hf_names(name)) <= held:
                    out.add(name)
            except KeyError:
                pass
        return out
    if root == "hf":
        from ..models.hf.folder import open_folder
        names = set()
        for hf in open_folder(step).tensors:
            try:
                ours = adapter.ours_of_hf(hf) if adapter is not None else None
            except KeyError:
                ours = None
            if ours is not None:
                names.add(ours)
        return names
    if root == "file":
        from ..checkpoint.index import index_single_file
        return set(index_single_file(step).entries)
    return set(checkpoint_specs(root, step))


def _set_all(params, values) -> None:
    """Every parameter from a loaded mapping. ``set_data`` (``set_parameter``): ops.assign checks a sliced
    Parameter against its full shape once communication is initialised. A Hugging Face folder's
    ``HFWeights`` is read now, straight into each parameter's memory, and its files closed after."""
    try:
        for p in params:
            if isinstance(values, HFWeights):
                fill_parameter(values, p)
            else:
                set_parameter(p, values[p.name])
    finally:
        if isinstance(values, HFWeights):
            values.close()


class Checkpointer:
    """Checkpoints of one rank's parameters. ``optimizer``/``wrapped``/``data`` are None in predict
    mode (weights only); ``wrapped`` is the hsdp wrapper when hsdp holds shards of the state.
    ``state_params``: non-trainable Parameters saved and loaded with the weights (``state_params_of``:
    the expert bias); a checkpoint without them leaves them as they are, with a warning."""

    def __init__(self, directory: str, rank: int, world: int, params: List, dp: int, dp_rank: int,
                 optimizer=None, wrapped=None, data=None, keep: Optional[int] = None,
                 log: Callable[[str], None] = print, async_save: bool = False, fallback: bool = False,
                 state_params: Sequence = (), copies: Sequence = (), hf_adapter=None, frozen: Sequence = (),
                 base_source: Optional[str] = None, mf_adapter=None):
        self.directory, self.rank, self.world = directory, rank, world
        # LoRA (``lora_checkpoint_args``): the frozen base weights are not saved (the adapter checkpoint is
        # small); a load takes them from the source when it holds them, else from ``base_source`` (the
        # model folder or checkpoint the run started from)
        self.frozen, self.base_source = list(frozen), base_source
        self.hf_adapter = hf_adapter    # the model family's Hugging Face name table (load_checkpoint: an HF folder)
        # (MindFormers checkpoint) -> its MindFormers name table for this model (models.mindformers.names)
        self.mf_adapter = mf_adapter
        self._mf = {}                   # path -> (MFCheckpoint, its table), opened once
        # DualPipe's up copy (``BuiltModel.copies``): parameters named as the down copy of the same model
        # stage on another pipeline rank, equal to it with equal AdamW moments (the two copies take the
        # same summed gradient). Saved once (by the down copy): the checkpoint is the one-chain model's;
        # loading fills both copies by name.
        self.copy_ids = {id(p) for p in copies}
        self.fallback = fallback      # resume_fallback_to_intact
        self.params, self.dp, self.dp_rank = params, dp, dp_rank
        self.state_params = list(state_params)
        self.optimizer, self.wrapped, self.data, self.keep, self.log = optimizer, wrapped, data, keep, log
        self.saver = None
        if async_save:
            self.saver = AsyncSaver(rank, world, on_published=self._published,
                                    on_error=lambda text: print(f"rank {rank}: {text}", flush=True))
        if rank == 0:       # no save runs yet: what is there from an interrupted one is garbage
            removed = remove_leftovers(directory)
            if removed:
                log(f"removed {len(removed)} leftover(s) of interrupted saves in {directory}: {removed[:4]}")

    def full_weights(self):
        """Context in which every parameter holds its full local (tensor-parallel) value: hsdp level3
        gathers its shards and keeps what is set inside (a no-op otherwise)."""
        return self.wrapped.unsharded() if self.wrapped is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ save
    def save(self, step: int, trainer_state: Dict[str, Any]) -> str:
        """Save weights, AdamW moments, this rank's data position and ``trainer_state`` (collective)."""
        own = [(i, p) for i, p in enumerate(self.params) if id(p) not in self.copy_ids]  # DualPipe: down copies
        if self.wrapped is not None:    # hsdp holds shards of the moments (and of the weights at level3)
            states = self.wrapped.full_optimizer_states(self.optimizer)
            moments = [(p, states[i][0], states[i][1]) for i, p in own]
        else:
            opt = self.optimizer
            moments = [(p, opt.moment1[i].asnumpy(), opt.moment2[i].asnumpy()) for i, p in own]
        opt = {"adam_m": {p.name: m for p, m, _ in moments}, "adam_v": {p.name: v for p, _, v in moments}}
        saved = [p for _, p in own]
        with self.full_weights():
            weights = {p.name: p.asnumpy() for p in saved}
        weights.update({p.name: p.asnumpy() for p in self.state_params})     # e.g. the expert bias
        layouts = {p.name: layout_of(p) for p in saved + self.state_params}
        if self.saver is not None:       # host copies taken; files written and published in the background
            self.saver.save(self.directory, step, weights, layouts, optimizer_state=opt,
                            data_state=self.data.state_dict(), trainer_state=trainer_state)
            return os.path.join(self.directory, f"step_{step}")
        path = save_checkpoint(self.directory, step, weights, layouts, optimizer_state=opt,
                               data_state=self.data.state_dict(), trainer_state=trainer_state,
                               rank=self.rank, world_size=self.world)
        self._published(step)
        return path

    def wait(self) -> None:
        """Let an asynchronous save in flight finish (before exit, before loading)."""
        if self.saver is not None:
            self.saver.wait()

    def _published(self, step: int) -> None:
        if self.rank == 0 and self.keep is not None:
            self.prune(self.keep, step)

    def clear(self) -> None:
        """Remove every published step and the tracker (``overwrite_output_dir``: a fresh run)."""
        for step in list_steps(self.directory):
            shutil.rmtree(os.path.join(self.directory, f"step_{step}"), ignore_errors=True)
        tracker = os.path.join(self.directory, TRACKER)
        if os.path.exists(tracker):
            os.remove(tracker)

    def prune(self, keep: int, published: Optional[int] = None) -> None:
        """Delete all but the newest ``keep`` published steps (never the tracker's)."""
        latest = read_tracker(self.directory)
        steps = list_steps(self.directory)
        for step in steps[:max(len(steps) - keep, 0)]:
            if step != latest:
                shutil.rmtree(os.path.join(self.directory, f"step_{step}"), ignore_errors=True)
        remove_leftovers(self.directory, below=None if published is None else published + 1)

    # ------------------------------------------------------------------ load
    def load(self, directory: str, resume: bool, step: Any = None) -> int:
        """Load weights (resharded to this job's layout) from a checkpoint directory, one of its
        ``step_<k>`` directories or a .safetensors file of full tensors; with ``resume`` also the
        AdamW moments, the step counter (hence the lr position) and the data position. Returns the
        step training continues from (0 without resume)."""
        if step is None:
            root, step = resolve_checkpoint(directory)
        else:
            root = directory
        if self.fallback and root not in ("file", "hf", "mf"):
            step = self._intact_step(root, step)
        targets = {p.name: (tuple(global_shape_of(p)), layout_of(p)) for p in self.params}
        where = f"load_checkpoint = {directory!r}"
        params, frozen = self.params, []
        if self.frozen:          # LoRA: adapters absent from the source (a base model) keep their initial values
            saved = self._saved(root, step)
            params = [p for p in self.params if p.name in saved]
            frozen = [p for p in self.frozen if p.name in saved]
            targets = {p.name: (tuple(global_shape_of(p)), layout_of(p)) for p in params + frozen}
        if root == "hf":
            params, targets = self._without_absent_mtp(step, params, targets)
        if root == "mf":
            self._mf_adapter_of(step)
        try:
            state = []
            if self.state_params:        # checkpoints written before the expert bias was saved have none
                saved = self._saved(root, step)
                state = [p for p in self.state_params if p.name in saved]
                absent = [p.name for p in self.state_params if p.name not in saved]
                if absent and self.rank == 0:
                    self.log(f"WARNING: {directory} holds no {absent[0]}" + (f" (nor {len(absent) - 1} more)"
                             if len(absent) > 1 else "") + ": it keeps its initial value (the expert bias: zero)")
                targets.update({p.name: (tuple(global_shape_of(p)), layout_of(p)) for p in state})
            if root == "hf":
                values = self._load_hf(step, targets)
            elif root == "mf":
                values = self._load_mf(step, targets)
            elif root == "file":
                values = shard_single_file(step, targets, self.rank, strict=False)
            else:
                values = load_checkpoint(root, targets, self.rank, step=step, strict=False)
            with self.full_weights():
                _set_all(params + frozen + state, values)
            if len(frozen) < len(self.frozen):
                have = {id(p) for p in frozen}
                self._load_base([p for p in self.frozen if id(p) not in have])
            if not resume:
                if self.rank == 0:
                    self.log(f"loaded weights from {step if root in ('hf', 'mf') else directory}" +
                             ("" if root in ("file", "hf", "mf") else f" (step {step})"))
                return 0
            if root == "file":
                raise ConfigError([f"{where}: a single file holds weights only; resume needs a checkpoint directory"])
            state = load_training_state(root, step)
            # strict=False as for the weights: a pipeline stage asks only for its own parameters
            opt = load_optimizer_state(root, targets, self.rank, step=step, strict=False)
        except CheckpointError as e:
            raise ConfigError([f"{where}: {e}" + _intact_hint(root, step, resume)]) from None
        missing = [p.name for p in self.params if p.name not in opt.get("adam_m", {}) or p.name not in
                   opt.get("adam_v", {})]
        if missing:
            raise ConfigError([f"{where}: resume_training needs AdamW moments, missing for {missing[:5]}; "
                               "load weights only (resume_training: False)"])
        for p, m, v in zip(self.params, self.optimizer.moment1, self.optimizer.moment2):
            full_m, full_v = opt["adam_m"][p.name], opt["adam_v"][p.name]
            if self.wrapped is not None:       # this rank's hsdp shard of the full moments
                full_m, full_v = self.wrapped.shard_of(p, full_m), self.wrapped.shard_of(p, full_v)
            set_parameter(m, full_m)
            set_parameter(v, full_v)
        saved = state.trainer_state or {}
        trained = int(saved.get("step", state.step))
        # the optimizer's own count (hence the lr position) is lower than the loop's after skipped steps
        set_parameter(self.optimizer.global_step, np.array(int(saved.get("optimizer_step", trained)), np.int32))
        self._restore_data(state, where)
        return trained

    def _without_absent_mtp(self, folder: str, params: List, targets: Dict) -> Tuple[List, Dict]:
        """A Hugging Face folder with no multi-token prediction layers at all (``transformers`` drops them when
        it saves DeepSeek-V3): the MTP depths keep their initial values, with a warning, so an MTP fine-tune
        can start from such a folder. A folder holding some of their tensors but not all is still an error
        (``_load_hf`` names the missing ones)."""
        prefix = MTP_NAME.split("{", 1)[0]         # "mtp.layers."
        mtp = [p for p in params if p.name.startswith(prefix)]
        if not mtp or _saved_names("hf", folder, self.hf_adapter) & {p.name for p in mtp}:
            return params, targets
        if self.dp_rank == 0:
            self.log(f"WARNING: {folder} holds no multi-token prediction layers (model.layers.<num_layers>.*): "
                     f"the {len(mtp)} MTP weights ({mtp[0].name}, ...) keep their initial values")
        drop = {p.name for p in mtp}
        return [p for p in params if p.name not in drop], {k: v for k, v in targets.items() if k not in drop}

    def _load_base(self, missing: List) -> None:
        """LoRA: the frozen base weights a checkpoint does not hold (an adapter checkpoint), from
        ``base_source``."""
        if self.base_source is None:
            if self.rank == 0:
                self.log(f"WARNING: LoRA: no base weights for {missing[0].name} (nor {len(missing) - 1} more): give "
                         "the base model as pretrained_model_dir; they keep their initial values")
            return
        root, step = resolve_checkpoint(self.base_source)
        targets = {p.name: (tuple(global_shape_of(p)), layout_of(p)) for p in missing}
        try:
            if root == "hf":
                values = self._load_hf(step, targets)
            elif root == "mf":
                values = self._load_mf(step, targets)
            elif root == "file":
                values = shard_single_file(step, targets, self.rank, strict=False)
            else:
                values = load_checkpoint(root, targets, self.rank, step=step, strict=False)
        except CheckpointError as e:
            raise ConfigError([f"LoRA base weights from {self.base_source!r}: {e}"]) from None
        absent = [p.name for p in missing if p.name not in values]
        if absent:
            raise ConfigError([f"LoRA base weights from {self.base_source!r}: no {absent[0]}" +
                               (f" (nor {len(absent) - 1} more)" if len(absent) > 1 else "")])
        with self.full_weights():
            _set_all(missing, values)
        if self.rank == 0:
            self.log(f"LoRA: {len(missing)} frozen base weights loaded from {self.base_source}")

    def _load_hf(self, folder_path: str, targets):
        """This rank's region of every target from a Hugging Face folder, through the family's table, in the
        parameters' dtypes: an ``HFWeights`` mapping, checked now (a problem -- a missing tensor, a shape the
        config does not give -- is a ConfigError naming the tensor and the file) and read one tensor at a time
        when asked for (``fill_parameter`` reads straight into a parameter); close it after."""
        from ..models.hf.folder import FolderError, open_folder
        from ..models.hf.loader import HFWeights, unused_tensors
        where = f"load_checkpoint = {folder_path!r}"
        if self.hf_adapter is None:
            raise ConfigError([f"{where}: a Hugging Face model folder, but this model family has no Hugging Face "
                               "name table (register one with register_model(..., state_dict_adapter=...))"])
        dtypes = {p.name: ms.dtype_to_nptype(p.dtype) for p in self.params + self.state_params + self.frozen}
        try:
            folder = open_folder(folder_path)
            values = HFWeights(folder, self.hf_adapter, targets, self.rank, dtype=dtypes)
        except FolderError as e:
            raise ConfigError([f"{where}: {e}"]) from None
        if self.rank == 0 and self.world == 1:
            extra = unused_tensors(folder, self.hf_adapter, list(targets))
            if extra:
                self.log(f"WARNING: {len(extra)} tensor(s) of {folder_path} are not used by the model "
                         f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}): does the config describe "
                         "fewer layers or parts than the weights hold?")
        return values

    def _saved(self, root: str, step) -> set:
        if root == "mf":
            names = [p.name for p in self.params + self.frozen + self.state_params]
            return _saved_names(root, step, self._mf_adapter_of(step), names)
        return _saved_names(root, step, self.hf_adapter)

    def _mf_adapter_of(self, path: str):
        """(the opened MindFormers checkpoint, its name table for this model); a ConfigError names a checkpoint
        that cannot be read or whose names follow no MindFormers scheme."""
        from ..models.hf.folder import FolderError
        from ..models.mindformers.files import open_checkpoint
        where = f"load_checkpoint = {path!r}"
        if path not in self._mf:
            if self.mf_adapter is None:
                raise ConfigError([f"{where}: a MindFormers checkpoint, but this model family has no MindFormers "
                                   "name table (models/mindformers/names.py: llama, qwen2, qwen3, qwen3_moe, "
                                   "deepseek_v3)"])
            try:
                ckpt = open_checkpoint(path)
                self._mf[path] = ckpt, self.mf_adapter(ckpt)
            except (FolderError, ValueError) as e:
                raise ConfigError([f"{where}: {e}"]) from None
        return self._mf[path]

    def _load_mf(self, path: str, targets):
        """This rank's region of every target from a MindFormers checkpoint through its name table, as
        ``_load_hf`` (checked now: a missing tensor or a shape the config does not give is a ConfigError naming
        the tensor and the checkpoint; read one tensor at a time after)."""
        from ..models.hf.folder import FolderError
        from ..models.mindformers.load import mindformers_weights, unused
        ckpt, adapter = self._mf_adapter_of(path)
        dtypes = {p.name: ms.dtype_to_nptype(p.dtype) for p in self.params + self.state_params + self.frozen}
        try:
            values = mindformers_weights(ckpt, adapter, targets, self.rank, dtype=dtypes)
        except FolderError as e:
            raise ConfigError([f"load_checkpoint = {path!r}: {e}"]) from None
        if self.rank == 0 and self.world == 1:
            extra = unused(ckpt, adapter, list(targets))
            if extra:
                self.log(f"WARNING: {len(extra)} tensor(s) of {path} are not used by the model "
                         f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}): does the config describe "
                         "fewer layers or parts than the weights hold?")
        return values

    def _intact_step(self, root: str, step) -> Any:
        """``resume_fallback_to_intact``: ``step`` when it verifies, else the newest older intact step,
        with a warning. Every rank verifies every shard of the same files, so all ranks choose the
        same step without talking to each other."""
        try:
            number = resolve_step(root, step)
        except (CheckpointError, ValueError):
            return step                                    # reported by the load itself
        problems = verify_step(root, number)
        if not problems:
            return number
        intact = newest_intact_step(root, below=number)
        if intact is None:
            return number                                  # the load names the problem: nothing to fall back to
        if self.rank == 0:
            self.log(f"WARNING: step_{number} in {root} fails verification ({problems[0]}"
                     f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); "
                     f"resume_fallback_to_intact: loading step_{intact}, the newest intact step")
        return intact

    def _restore_data(self, state, where: str) -> None:
        """This rank's data position from the saved ones: the state of a rank with the same data-parallel
        index when the data-parallel size is unchanged, else the same global position re-split."""
        saved = [s for s in state.data_states.values() if s]
        if not saved:
            raise ConfigError([f"{where}: the checkpoint has no data state; load weights only "
                               "(resume_training: False)"])
        same = [s for s in saved if s.get("dp_size") == self.dp and s.get("dp_rank") == self.dp_rank]
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
        moved = dict(saved[0], dp_rank=self.dp_rank, dp_size=self.dp,
                     consumed_samples=epoch * self.data.samples_per_epoch + pos * old_dp // self.dp)
        self.data.load_state_dict(moved)
