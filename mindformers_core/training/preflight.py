"""The trainer's own checks, run before any process group exists.

The schema and its rules (``config.py``, ``rules.py``) judge the keys; these checks judge what the
trainer does with them: the files named (data, tokenizer, checkpoint), the tokenizer's vocabulary
against ``vocab_size``, the pipeline schedule (built from stage placeholders, so its own validator
runs), the model class and the features not wired. All problems come back as one ConfigError.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from ..checkpoint import CheckpointError, list_steps, load_training_state
from ..checkpoint.format import METADATA, TRACKER, read_tracker
from ..data.tokenizer import build_tokenizer
from ..distributed.env import requested_device_target
from ..pipeline.schedules import build_schedule
from ..pipeline.stage import StageInfo
from .config import Config, ConfigError
from .shape import JobShape
from .topology import Topology

_STEP_DIR = re.compile(r"^step_(\d+)$")
_JSONL = (".jsonl", ".json")




def callback(cfg: Config, kind: str) -> Optional[Config]:
    """The last ``callbacks`` entry of ``type: kind``, or None."""
    found = [cb for cb in (cfg.callbacks or []) if cb.get("type") == kind]
    return found[-1] if found else None


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


def _mindformers(path: str, where: str) -> Tuple[str, Any]:
    """``("mf", path)`` for a MindFormers checkpoint (checked here, before any process group: files, index,
    headers, a name scheme MindFormers uses)."""
    from ..models.hf.folder import FolderError
    from ..models.mindformers.files import open_checkpoint
    from ..models.mindformers.names import detect_scheme, scheme_problem
    try:
        ckpt = open_checkpoint(path)
    except FolderError as e:
        raise ConfigError([f"{where}: {e}"]) from None
    if detect_scheme(ckpt.tensors) is None:
        raise ConfigError([f"{where}: a MindFormers checkpoint? {scheme_problem(ckpt.path, list(ckpt.tensors))}"])
    return "mf", os.path.abspath(path)


def resolve_checkpoint(path: str, key: str = "load_checkpoint") -> Tuple[str, Any]:
    """``(root, step)`` for a checkpoint path: a root directory (``"latest"``), one of its
    ``step_<k>`` directories, ``("file", path)`` for a safetensors file of full tensors, ``("hf", path)`` for
    a Hugging Face model folder (config.json + safetensors), or ``("mf", path)`` for a MindFormers checkpoint (a
    ``.ckpt`` file, a ``.safetensors`` file with MindFormers' names, its unified folder with
    ``param_name_map.json``, a MindFormers 2.x ``iteration_<n>/`` folder or root); folders and files are checked
    here, before any process group (files, index, truncation, name scheme)."""
    where = f"{key} = {path!r}"
    if os.path.isfile(path):
        if path.endswith(".ckpt"):
            return _mindformers(path, where)
        if not path.endswith(".safetensors"):
            raise ConfigError([f"{where}: a file, but only .safetensors files (ours, or MindFormers') and MindSpore "
                               ".ckpt files load directly (or give a checkpoint directory written by this trainer)"])
        from ..models.hf.folder import FolderError, read_safetensors_header
        from ..models.mindformers.names import detect_scheme
        try:
            names = read_safetensors_header(path, os.path.dirname(path) or ".")
        except FolderError as e:
            raise ConfigError([f"{where}: {e}"]) from None
        if detect_scheme(names) is not None:
            return _mindformers(path, where)
        return "file", path
    if not os.path.isdir(path):
        raise ConfigError([f"{where}: no such checkpoint directory or file"])
    from ..models.mindformers.files import is_mindformers_dir
    if is_mindformers_dir(path):
        return _mindformers(path, where)
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if m and os.path.isfile(os.path.join(path, METADATA)):
        return os.path.dirname(os.path.normpath(path)), int(m.group(1))
    if os.path.isfile(os.path.join(path, TRACKER)) or list_steps(path):
        return path, "latest"
    if os.path.isfile(os.path.join(path, "config.json")):
        from ..models.hf.folder import FolderError, open_folder
        try:
            open_folder(path)
        except FolderError as e:
            raise ConfigError([f"{where}: {e}"]) from None
        return "hf", os.path.abspath(path)
    raise ConfigError([f"{where}: not a checkpoint directory (no {TRACKER} and no step_<k>/ inside); give the "
                       "<output_dir>/checkpoint directory, one of its step_<k> directories, a .safetensors file, "
                       "a Hugging Face model folder, or a MindFormers checkpoint (.ckpt / .safetensors file, its "
                       "unified folder with param_name_map.json)"])


# checkpoint sources that hold weights only (no optimizer or data state this trainer resumes from)
WEIGHTS_ONLY = {"file": "a single file", "hf": "a Hugging Face model folder", "mf": "a MindFormers checkpoint"}

# TransformerConfig's MoE fields as the YAML names them (the model config's errors name the file's keys)
MOE_FIELD_KEYS = {
    "num_moe_experts": "model.model_config.num_experts", "moe_router_topk": "model.model_config.num_experts_per_tok",
    "moe_ffn_hidden_size": "model.model_config.moe_intermediate_size",
    "moe_shared_expert_intermediate_size": "model.model_config.moe_shared_expert_intermediate_size",
    "moe_first_k_dense_layers": "model.model_config.first_k_dense_replace",
    "moe_router_topk_scaling_factor": "model.model_config.routed_scaling_factor",
    "moe_router_score_function": "model.model_config.scoring_func",
    "moe_router_norm_topk_prob": "model.model_config.norm_topk_prob",
    "moe_router_num_groups": "model.model_config.n_group", "moe_router_group_topk": "model.model_config.topk_group",
    **{k: f"model.model_config.{k}" for k in (
        "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_aux_loss_coeff", "moe_aux_loss_micro_batches",
        "moe_router_load_balancing_type", "moe_expert_capacity_factor", "moe_token_drop_policy")},
    "expert_model_parallel_size": "parallel_config.expert_parallel", "data_parallel_size": "parallel_config.data_parallel",
    "tensor_model_parallel_size": "parallel_config.model_parallel", "num_layers": "model.model_config.num_layers",
}


def moe_key_message(message: str) -> str:
    """``TransformerConfig: moe_router_topk=9: rule`` -> ``model.model_config.num_experts_per_tok = 9: rule``
    (other names in the rule too)."""
    m = re.match(r"^(?:\w+: )?(\w+)=(.*?): (.*)$", message)
    if not m:
        return message
    field, value, rule = m.groups()
    rule = re.sub(r"\b(\w+)=", lambda x: f"{MOE_FIELD_KEYS.get(x.group(1), x.group(1))} = ", rule)
    return f"{MOE_FIELD_KEYS.get(field, field)} = {value}: {rule}"


@dataclass
class Preflight:
    """What the checks found and the trainer uses: files, tokenizer, what to load, warnings."""
    files: List[str] = field(default_factory=list)
    tokenizer_file: str = ""
    tokenizer_kind: str = "llama"    # the model family's (ModelSpec.tokenizer): build_tokenizer(kind, file)
    eval_files: Optional[List[str]] = None
    checkpoint_source: Optional[Tuple[str, Any, bool]] = None   # (root or "file", step or path, resume)
    warnings: List[str] = field(default_factory=list)


def preflight(cfg: Config, shape: JobShape, worker_num: int, output_dir: str) -> Preflight:
    """Everything the trainer can check before distributed init; raises one ConfigError."""
    checks = _Checks(cfg, shape, output_dir)
    checks.shape_errors(worker_num)
    checks.lora_errors()
    if checks.errors:
        raise ConfigError(checks.errors)
    return checks.files_and_features()


class _Checks:
    def __init__(self, cfg: Config, shape: JobShape, output_dir: str):
        self.cfg, self.shape, self.output_dir = cfg, shape, output_dir
        self.errors: List[str] = []
        self.found = Preflight()

    def lora_errors(self) -> None:
        """LoRA settings (``pet_config`` / ``lora_config``) and the layouts they do not combine with (dropout under
        tensor parallel; a pipeline rank with no adapted layer), named before any process group exists."""
        if dict(self.cfg.model.model_config).get("pet_config") is None:
            return
        from .model_builder import lora_settings, lora_stage_problems
        try:
            lora_settings(self.cfg, self.shape)
            self.errors.extend(lora_stage_problems(self.cfg, self.shape))
        except ConfigError as e:
            self.errors.extend(e.errors)

    def context_parallel_errors(self) -> None:
        """What context parallelism does not combine with yet (the sizes themselves are schema rules)."""
        cfg, shape = self.cfg, self.shape
        cp = f"parallel_config.context_parallel = {shape.cp}"
        # cp x pp and cp + hsdp level3 run in both modes (docs/context_parallel.md): the kernels'
        # backward reads its rank flags from its arguments, never a Parameter or a function its forward uses
        if shape.predicting:
            self.errors.append(f"{cp} with run_mode = 'predict': prediction keeps the whole sequence on every rank "
                               "(a sequence-split KV cache is not designed); set context_parallel: 1 (a checkpoint "
                               "trained with cp loads unchanged: cp does not split weights)")
        if float(cfg.model.model_config.get("attention_dropout", 0.0) or 0.0) > 0:
            self.errors.append(f"{cp}: model.model_config.attention_dropout must be 0 (the context-parallel "
                               "attention kernels have no dropout)")

    def moe_errors(self) -> None:
        """Mixture of experts and expert parallelism (docs/moe.md): sizes, what ep does not combine with yet,
        and the model config's own MoE rules, named by the file's keys."""
        cfg, shape = self.cfg, self.shape
        mc, pc = cfg.model.model_config, cfg.parallel_config
        ep, experts = int(pc.get("expert_parallel", 1) or 1), mc.get("num_experts")
        moe = experts is not None and experts > 1
        epk = f"parallel_config.expert_parallel = {ep}"
        if ep > 1:
            if not moe:
                self.errors.append(f"{epk}: needs a mixture-of-experts model (model.model_config.num_experts > 1); "
                                   "set it to 1 for a dense model")
            if shape.dp % ep:
                self.errors.append(f"{epk}: must divide parallel_config.data_parallel = {shape.dp} (the expert-parallel "
                                   "groups are carved out of data parallel)")
            for active, what, fix in ((shape.cp > 1, f"parallel_config.context_parallel = {shape.cp}",
                                       "context_parallel: 1"),):
                if active:
                    self.errors.append(f"{epk} with {what}: expert parallelism does not combine with it yet "
                                       f"(docs/moe.md, limits); set {fix} or expert_parallel: 1")
            if shape.sharded_dp:     # hsdp shards expert parameters over their expert-data-parallel group
                self.expert_hsdp_errors(epk, ep)
        if not moe or self.errors:
            return
        from ..models import get_model_spec
        try:
            spec = get_model_spec(cfg.model.arch.type)
            spec.config_class.from_model_config(dict(mc), dict(pc, data_parallel=shape.dp, model_parallel=shape.tp,
                                                                context_parallel=shape.cp))
        except ValueError as e:
            self.errors.append(moe_key_message(str(e)))

    def expert_hsdp_errors(self, epk: str, ep: int) -> None:
        """Expert parallelism with hsdp (parallel.enable_parallel_optimizer): expert parameters are sharded
        over their own expert-data-parallel group (docs/moe.md); what does not combine, named."""
        cfg, shape = self.cfg, self.shape
        size = int(cfg.hsdp.shard_size)
        size = shape.dp if size == -1 else size
        if size >= 1 and shape.dp % ep == 0 and shape.dp % size == 0:
            from ..hsdp.plan import domain_shard_size
            try:
                domain_shard_size(size, shape.dp, shape.dp // ep)
            except ValueError as e:
                self.errors.append(f"hsdp.shard_size = {cfg.hsdp.shard_size} with {epk}: {e}")

    # ------------------------------------------------------------------ sizes, model, schedule
    def shape_errors(self, worker_num: int) -> None:
        from ..models import registered_models
        cfg, shape, errors = self.cfg, self.shape, self.errors
        rc = cfg.runner_config
        if shape.pp > 1:
            self.pipeline_errors()
        if shape.cp > 1:
            self.context_parallel_errors()
        self.mtp_errors()
        self.moe_errors()
        models = registered_models()
        if cfg.model.arch.type not in models:
            errors.append(f"model.arch.type = {cfg.model.arch.type!r}: registered models are {models} "
                          "(user models register with @register_model and load with --register_path)")
        mc = cfg.model.model_config
        for key in ("compute_dtype", "param_init_dtype"):
            if mc[key] == "bfloat16" and requested_device_target() == "CPU":
                errors.append(f"model.model_config.{key} = 'bfloat16': MindSpore's CPU kernels have no bfloat16 "
                              "MatMul/BatchMatMul/Softmax; set it to float32 (or float16) on CPU")
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
        problem = shape.world_problem(worker_num, "the worker count")
        if problem:
            errors.append(problem + " (msrun --worker_num)")

    def mtp_errors(self) -> None:
        """Multi-token prediction (docs/deepseek_v3.md) with what it does not combine with yet, and the layer
        split it needs under a pipeline."""
        cfg, shape = self.cfg, self.shape
        depths = cfg.model.model_config.get("mtp_num_layers")
        if not depths:
            return
        origin = getattr(getattr(cfg, "report", None), "origin", {}) or {}
        key = origin.get("model.model_config.mtp_num_layers", "model.model_config.mtp_num_layers")
        if shape.pp > 1:
            self.mtp_pipeline_errors(key, depths)

    def mtp_pipeline_errors(self, key: str, depths) -> None:
        """MTP under a pipeline: the depths sit on the last stage with a copy of the embedding (its gradient summed
        with the first stage's by the pipeline runtime). Proven with the plain update and hsdp, the one-directional
        schedules, DualPipeV and the bidirectional DualPipe. Refused: a layer split giving the last stage no decoder
        layer (MindFormers counts the MTP layers in the last stage's share
        of its split: a last stage without layers has no room for them)."""
        cfg, shape = self.cfg, self.shape
        topo = Topology(0, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler, cp=shape.cp)
        num_layers = int(cfg.model.model_config.num_layers)
        pipe = cfg.parallel.pipeline_config
        split = pipe.layers_per_stage
        offset = cfg.model.model_config.get("offset", 0)
        try:
            if isinstance(split, list):
                counts, where = [len(r) for r in topo.layer_ranges(num_layers, split)], \
                    f"parallel.pipeline_config.layers_per_stage = {split}"
            elif isinstance(offset, list) and topo.model_stage_num == len(offset):
                counts, where = [num_layers // topo.model_stage_num + o for o in offset], \
                    f"model.model_config.offset = {offset}"
            else:
                return          # uniform, measured (auto), or a split the pipeline checks name
        except (TypeError, ValueError):
            return
        if counts and counts[-1] < 1:
            self.errors.append(f"{where} with {key} = {depths}: the last pipeline stage gets no decoder layer, which "
                               f"leaves no room for the {depths} multi-token prediction depth(s) that run there after "
                               f"its layers (layers per stage {counts}); move at least one layer to the last stage")

    def pipeline_errors(self) -> None:
        """Pipeline settings the schema cannot judge alone: build this job's schedule from stage
        placeholders (pure logic: the schedule's own validator runs) and check the model fits."""
        cfg, shape, pc = self.cfg, self.shape, self.cfg.parallel_config
        pipe = cfg.parallel.pipeline_config
        topo = Topology(0, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler, cp=shape.cp)
        if isinstance(pipe.layers_per_stage, list):   # (the schema's rules checked the split itself)
            try:
                ranges = topo.layer_ranges(int(cfg.model.model_config.num_layers), pipe.layers_per_stage)
            except (TypeError, ValueError):
                ranges = None
            for r in range(topo.pp) if ranges else ():
                held = [s for s, q in enumerate(topo.model_placement) if q == r]
                if not any(len(ranges[s]) for s in held) and 0 not in held and topo.model_stage_num - 1 not in held:
                    self.errors.append(f"parallel.pipeline_config.layers_per_stage = {pipe.layers_per_stage}: "
                                       f"pipeline rank {r} would hold stages {held} with no layers and no embedding "
                                       "or output layer (nothing to train); give every rank at least one layer")
        try:
            build_schedule(shape.scheduler, [StageInfo(s, topo.stage_num) for s in topo.stages], shape.micro_batch_num)
        except ValueError as e:
            self.errors.append(f"parallel.pipeline_config.pipeline_scheduler = {shape.scheduler!r} with "
                               f"parallel_config.pipeline_stage {pc.pipeline_stage}, pipeline_interleave "
                               f"{pipe.pipeline_interleave}, micro_batch_num {pc.micro_batch_num}: {e}")

    # ------------------------------------------------------------------ files and features
    def files_and_features(self) -> Preflight:
        cfg, shape, found, errors = self.cfg, self.shape, self.found, self.errors
        found.checkpoint_source = self.checkpoint_source()
        source = found.checkpoint_source
        if source is not None and source[0] == "hf" and not source[2] \
                and dict(cfg.model.model_config).get("pet_config") is not None:
            from .model_builder import lora_base_problems
            try:
                errors.extend(lora_base_problems(cfg, shape, source[1]))
            except ConfigError as e:
                errors.extend(e.errors)
        if not shape.predicting:
            try:
                ds = cfg.train_dataset
                if ds.type == "mindrecord":
                    found.files = self.mindrecord_files()
                elif ds.type == "megatron":
                    found.files = self.megatron_prefixes()
                elif ds.type == "hf":
                    found.files = self.hf_source()
                elif ds.dataset_dir:
                    found.files = data_files(os.path.abspath(ds.dataset_dir), ds.type)
                elif ds.type != "text":
                    errors.append(f"train_dataset.type = {ds.type!r}: the built-in corpus "
                                  "(dataset_dir: null) is plain text; use type: text or give a dataset_dir")
                else:
                    found.files = [os.path.join(self.output_dir, "corpus.txt")]   # built by the trainer
            except ConfigError as e:
                errors += e.errors
        if not shape.predicting:
            self.earlier_run()
        from ..models import get_model_spec
        found.tokenizer_kind = get_model_spec(cfg.model.arch.type).tokenizer
        found.tokenizer_file = self.tokenizer_file()
        if not shape.predicting and cfg.train_dataset.type == "hf":
            self.hf_tokenizer_and_lengths()
        found.eval_files = self.eval_files() if not shape.predicting else None
        if shape.sharded_dp and shape.pp > 1 and shape.accumulate > 1:
            errors.append(f"runner_config.gradient_accumulation_steps = {shape.accumulate}: with pipeline_stage > 1 "
                          "and enable_parallel_optimizer (hsdp) accumulate through micro_batch_num instead (the "
                          "schedule already sums microbatch gradients); use 1")
        if shape.sharded_dp and shape.dp == 1:
            found.warnings.append("warning: parallel.enable_parallel_optimizer = True with data_parallel 1: nothing "
                                  "to shard over; hsdp runs with one rank per shard group")
        if errors:
            raise ConfigError(errors)
        return found

    def earlier_run(self) -> None:
        """A fresh start must not silently replace an earlier run's loss log and checkpoints."""
        cfg = self.cfg
        if self.found.checkpoint_source is not None and self.found.checkpoint_source[2]:
            return                                          # resuming: the run continues
        if cfg.resume_training or cfg.get("overwrite_output_dir"):
            return                                          # (resume without a checkpoint yet: warned)
        monitor = callback(cfg, "MFLossMonitor")
        log = os.path.abspath((monitor.get("log_file") if monitor is not None else None)
                              or os.path.join(self.output_dir, "loss.jsonl"))
        held = []
        if os.path.isfile(log) and os.path.getsize(log) > 0:
            with open(log) as f:
                held.append(f"{log} ({sum(1 for line in f if line.strip())} logged steps)")
        ckpt = os.path.join(self.output_dir, "checkpoint")
        steps = list_steps(ckpt)
        if steps:
            held.append(f"checkpoints step_{steps[0]}..step_{steps[-1]} in {ckpt}")
        if held:
            self.errors.append(f"output_dir = {cfg.output_dir!r}: holds an earlier run ({'; '.join(held)}); resume it "
                               "with --resume_training True, or start afresh with another --output_dir or with "
                               "--overwrite_output_dir True (replaces that run's log and checkpoints)")

    def eval_files(self) -> Optional[List[str]]:
        """EvalCallBack's (or run_mode eval's) held-out data (``eval_dataset``), or None without them."""
        if callback(self.cfg, "EvalCallBack") is None and self.cfg.run_mode != "eval":
            return None
        ev = self.cfg.eval_dataset
        if self.shape.pp > 1:
            self.errors.append(f"callbacks: EvalCallBack with parallel_config.pipeline_stage = {self.shape.pp}: "
                               "evaluation runs the whole model's forward and the pipeline runtime has no "
                               "forward-only schedule yet; evaluate a checkpoint on pipeline_stage 1 instead")
            return None
        if not ev.dataset_dir:
            self.errors.append("eval_dataset.dataset_dir = None: EvalCallBack needs held-out data (a file or "
                               "directory of eval_dataset.type)")
            return None
        try:
            return data_files(os.path.abspath(ev.dataset_dir), ev.type, "eval_dataset")
        except ConfigError as e:
            self.errors += e.errors
        return None

    def mindrecord_files(self) -> List[str]:
        """MindRecord data: a .mindrecord file or a directory of them, and the tokenizer it was made with."""
        ds = self.cfg.train_dataset
        if not ds.dataset_dir:
            self.errors.append("train_dataset.type = 'mindrecord': needs train_dataset.dataset_dir (a .mindrecord "
                               "file or a directory of them, written by scripts/preprocess_mindrecord.py)")
            return []
        if not ds.tokenizer_file:
            self.errors.append("train_dataset.type = 'mindrecord': needs train_dataset.tokenizer_file, the tokenizer "
                               "the MindRecord data was written with (token ids mean nothing without it)")
        return data_files(os.path.abspath(ds.dataset_dir), ds.type)

    def hf_source(self) -> List[str]:
        """HFDataLoader (type hf): the handler chain checked, the local path named when missing (nothing is
        downloaded), and the batch keys it feeds checked against pipeline and context parallelism. The data
        itself is read by training/inputs.py (columns and broken lines are named there, before any step)."""
        from ..data.handlers import parse_handlers
        from ..data.hf_dataset import BUILDERS, feed_keys
        ds, shape = self.cfg.train_dataset, self.shape
        chain = None
        try:
            chain = parse_handlers(ds.get("handler"))
        except ValueError as e:
            self.errors.append(str(e))
        try:
            keys = feed_keys(ds.get("input_columns"), bool(chain and chain.pack_strategy))
        except ValueError as e:
            self.errors.append(f"train_dataset.{e}")
            keys = []
        path, files = ds.get("path"), ds.get("data_files")
        if path in BUILDERS.values() and files:
            files = [files] if isinstance(files, str) else list(files)
            missing = [f for f in files if not os.path.isfile(f)]
            if missing:
                self.errors.append(f"train_dataset.data_loader.data_files = {missing}: no such file(s)")
            return [os.path.abspath(f) for f in files]
        if not path:
            self.errors.append("train_dataset.data_loader.path is not set: HFDataLoader needs a local data file or "
                               "folder")
            return []
        target = os.path.abspath(os.path.expanduser(str(path)))
        if not os.path.exists(target):
            self.errors.append(f"train_dataset.data_loader.path = {path!r}: no such local file or folder (tried "
                               f"{target}); data sets are not downloaded here: download it first (e.g. "
                               "huggingface-cli download NAME --repo-type dataset --local-dir DIR) and give that path")
        return [target]

    def hf_tokenizer_and_lengths(self) -> None:
        """HFDataLoader tokenizes with a given tokenizer (the model folder's, or tokenizer_file), never one
        trained on the fine-tuning records; a handler seq_length longer than the model's is noted."""
        cfg = self.cfg
        if not os.path.isfile(self.found.tokenizer_file):
            self.errors.append("train_dataset.data_loader.type = 'HFDataLoader': the handlers need the model's tokenizer; "
                               "give pretrained_model_dir (a Hugging Face folder with tokenizer.json) or "
                               "train_dataset.tokenizer_file")
        seq = int(cfg.model.model_config.seq_length)
        handlers = cfg.train_dataset.get("handler") or []
        for i, h in enumerate(handlers if isinstance(handlers, list) else []):
            if isinstance(h, dict) and isinstance(h.get("seq_length"), int) and h["seq_length"] > seq:
                self.found.warnings.append(f"train_dataset.data_loader.handler[{i}].seq_length = {h['seq_length']}: "
                                           f"rows are model.model_config.seq_length = {seq} tokens (documents cut "
                                           "to it)")

    def megatron_prefixes(self) -> List[str]:
        """Megatron .bin/.idx data (BlendedMegatronDatasetDataLoader): the prefixes of data_path, each
        with a readable index, and the tokenizer the ids were written with."""
        from ..data.megatron import IndexedDataset, parse_data_path
        ds = self.cfg.train_dataset
        key = f"train_dataset.data_path = {ds.get('data_path')!r}"
        if not ds.tokenizer_file:
            self.errors.append("train_dataset.type = 'megatron': needs train_dataset.tokenizer_file, the tokenizer "
                               "the .bin/.idx data was written with (scripts/preprocess_megatron.py --tokenizer)")
        try:
            prefixes = [os.path.abspath(p) for _, p in parse_data_path(ds.get("data_path"))]
            for prefix in prefixes:
                IndexedDataset(prefix)
        except ValueError as e:
            self.errors.append(f"{key}: {e}")
            return []
        return prefixes

    def checkpoint_source(self) -> Optional[Tuple[str, Any, bool]]:
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
                if root in WEIGHTS_ONLY:
                    raise ConfigError([f"resume_training = {resume!r}: {WEIGHTS_ONLY[root]} holds weights only; "
                                       "resume needs a checkpoint directory (optimizer and data state)"])
                return root, step, True
            if cfg.load_checkpoint:
                root, step = resolve_checkpoint(cfg.load_checkpoint)
                if resume and root in WEIGHTS_ONLY:
                    raise ConfigError([f"load_checkpoint = {cfg.load_checkpoint!r}: {WEIGHTS_ONLY[root]} holds "
                                       "weights only here; resume_training needs a checkpoint directory of this "
                                       "trainer (load it with resume_training: False to fine-tune from it)"])
                return root, step, bool(resume) and not self.shape.predicting
            if resume:
                own = os.path.join(self.output_dir, "checkpoint")
                if read_tracker(own) is not None or list_steps(own):
                    return own, "latest", True
                self.found.warnings.append(f"resume_training = True: no checkpoint in {own} yet; starting at step 0")
        except ConfigError as e:
            self.errors += e.errors
        except CheckpointError as e:
            self.errors.append(f"load_checkpoint = {cfg.load_checkpoint!r}: {e}")
        return None

    def tokenizer_file(self) -> str:
        """The tokenizer to use: train_dataset.tokenizer_file, else the model folder's tokenizer.json (a
        Hugging Face family with ``pretrained_model_dir``), else (predict) the one the checkpoint was trained
        with, else <output_dir>/tokenizer_<vocab>.model (trained by the trainer when missing)."""
        cfg, source, errors = self.cfg, self.found.checkpoint_source, self.errors
        vocab = int(cfg.model.model_config.vocab_size)
        tok = cfg.train_dataset.tokenizer_file
        key = "train_dataset.tokenizer_file"
        folder = cfg.get("pretrained_model_dir") or (source[1] if source and source[0] == "hf" else None)
        if not tok and folder and self.found.tokenizer_kind == "hf":
            tok, key = os.path.join(folder, "tokenizer.json"), f"the tokenizer of the model folder {folder}"
            if not os.path.isfile(tok):
                errors.append(f"pretrained_model_dir = {folder!r}: no tokenizer.json in the model folder; give "
                              "train_dataset.tokenizer_file")
                return tok
        if not tok and self.shape.predicting and source and source[0] not in WEIGHTS_ONLY:
            try:
                tok = (load_training_state(source[0], source[1]).trainer_state or {}).get("tokenizer_file")
                key = f"the tokenizer recorded in the checkpoint {source[0]}"
            except CheckpointError:
                tok = None
        if not tok:
            own = os.path.join(self.output_dir, f"tokenizer_{vocab}.model")
            if self.shape.predicting and not os.path.exists(own):
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
        if tok.endswith(".model"):       # a SentencePiece model is read as one, whatever the family's kind
            self.found.tokenizer_kind = "llama"
        try:
            pieces = build_tokenizer(self.found.tokenizer_kind, tok).vocab_size
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError variants
            errors.append(f"{key} = {tok!r}: not a sentencepiece model ({type(e).__name__}: {e})")
            return tok
        if pieces != vocab and not (self.found.tokenizer_kind == "hf" and pieces < vocab):
            errors.append(f"model.model_config.vocab_size = {vocab}: must equal the tokenizer's vocabulary, "
                          f"{pieces} pieces in {key} = {tok!r}" + (" (a Hugging Face model's embedding may be "
                                                                  "larger than its tokenizer, not smaller)"
                                                                  if self.found.tokenizer_kind == "hf" else ""))
        return tok
