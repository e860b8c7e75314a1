"""The feature grid: every feature x model x data x layout x mode a user's YAML can reach, as data.

One declarative table (``FEATURES``, ``MODELS``, ``DATA``, ``LAYOUTS``, ``MODES``: YAML keys, nothing else)
generates the cells. A cell is the user's path: a MindFormers graph-dialect YAML written for it (the tiny
transformers-made Hugging Face folder of its model as ``pretrained_model_dir`` and ``load_checkpoint``, its data,
its layout's ``parallel_config`` / ``parallel`` / ``hsdp`` keys, ``pet_config`` for LoRA), run by the trainer's
command line (``training.cli.main``, what ``run_mindformer.py`` calls) on 2 msrun workers with
``--export_hf_dir``. Its outcome is one of:

* ``pass``: "= one process": the loss of every step and every tensor of the exported (LoRA: merged) Hugging
  Face folder within ``RTOL`` (relative; a tensor's error over its largest magnitude) of the one-process run of
  the same YAML with every parallel size 1 (the reference of its (feature, model, data, mode), run once and
  shared by its layouts);
* ``refused``: the trainer's ``ConfigError`` (the preflight: ``training.Trainer``'s constructor) names it
  before any process group; found here, in the launching process, before any worker starts (refused cells
  are never launched);
* ``fail``: anything else (a crash, a non-zero exit, a non-finite or missing loss, a loss or a weight off
  by more than ``RTOL``, a cell past its deadline), with its reason (the first error line of the failing
  rank) and the tail of every rank's log.

All the cells of a run go to one batched 2-worker launch (:func:`run_cells` in the same two processes, cell
after cell; MindSpore compiles each cell's graphs anew: a cell builds its own model). A failing cell ends the
launch (its peer may wait in a collective forever); :func:`run_grid` records it and launches the remaining
cells again. ``scripts/check_grid.py`` is the command line; docs/finetune.md "Feature grid".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "data")
RTOL = 1e-5
WORKERS = 2
STEPS = 2
GLOBAL_BATCH = 4           # rows per step in every cell and its reference
CELL_DEADLINE = 420.0      # seconds a cell may take on the workers (a DeepSeek-V3 jit compile under load: ~2 min)

# ---------------------------------------------------------------------------------------------- the table
# Every entry is YAML keys (dotted paths of MindFormers' graph dialect) and their values. "$name" values are
# the model's own (``Model.values``); a key whose value resolves to None is left out.

FEATURES: Dict[str, Dict[str, Any]] = {
    "full": {},
    "lora": {"model.model_config.pet_config": {"pet_type": "lora", "lora_rank": 4, "lora_alpha": 8,
                                               "lora_dropout": 0.0, "target_modules": "$lora_targets"}},
}


@dataclass(frozen=True)
class Model:
    folder: str                            # under tests/data/hf
    moe: bool
    what: str
    values: Dict[str, Any] = field(default_factory=dict)     # "$name" -> value
    keys: Dict[str, Any] = field(default_factory=dict)       # extra YAML keys of every cell of this model
    lora_folder: str = ""          # LoRA cells load this derivation of the folder (``DERIVED_FOLDERS``), not it


MODELS: Dict[str, Model] = {
    "qwen3": Model("qwen3", False, "dense Qwen3 (q/k norm), 2 layers", {
        "lora_targets": r".*q_proj|.*v_proj|.*o_proj|.*down_proj",
        "pp_offset": None,                      # 2 layers: one a stage
        "v_split": [0, 1, 1, 0]}),              # DualPipeV's 4 stages: the embedding and the head on their own
    "qwen3_moe": Model("qwen3_moe", True, "Qwen3-MoE (8 experts top-2, layer 0 dense), 3 layers", {
        "lora_targets": r".*q_proj|.*o_proj|.*experts\.(gate|up|down)_proj",
        "pp_offset": [1, 0],                    # 3 layers: 2 on the first stage, 1 on the second
        "v_split": [1, 1, 1, 0]}),
    "deepseek_v3": Model("deepseek_v3", True, "DeepSeek-V3 (MLA, 8 routed experts + 1 shared, MTP 1), 3 layers", {
        "lora_targets": r".*q_b_proj|.*kv_b_proj|.*o_proj|.*experts\.(gate|up|down)_proj",
        "pp_offset": [1, 0],
        "v_split": [0, 1, 1, 1]},               # the MTP depth runs on the last stage, after a decoder layer
        keys={"model.model_config.mtp_depth": 1, "model.model_config.mtp_loss_factor": 0.3},
        lora_folder="with_mtp_layer"),
}

DATA: Dict[str, Dict[str, Any]] = {
    # MindFormers' finetune_qwen3.yaml data section: Alpaca records through the template, packed into rows
    "packed": {
        "model.model_config.seq_length": 256,
        "train_dataset": {
            "input_columns": ["input_ids", "labels", "loss_mask", "position_ids"],
            "data_loader": {
                "type": "HFDataLoader", "load_func": "load_dataset", "path": "$fixtures/sft/alpaca_arith.json",
                "split": "train", "create_attention_mask": False, "create_compressed_eod_mask": False,
                "use_broadcast_data": True, "shuffle": False,
                "handler": [{"type": "AlpacaInstructDataHandler", "seq_length": 256, "padding": False},
                            {"type": "PackingHandler", "seq_length": 256, "pack_strategy": "pack"}]}}},
    # plain text, one document a line, cut into rows of seq_length by the folder's tokenizer
    "plain": {
        "model.model_config.seq_length": 64,
        "train_dataset": {"type": "text", "dataset_dir": "$work/corpus.txt", "shuffle": False}},
}

PP2 = {"parallel_config.pipeline_stage": 2}
LAYOUTS: Dict[str, Dict[str, Any]] = {
    "tp2_sp": {"parallel_config.model_parallel": 2, "parallel_config.use_seq_parallel": True},
    "dp2": {"parallel_config.data_parallel": 2, "runner_config.batch_size": GLOBAL_BATCH // 2},
    "cp2_ring": {"parallel_config.context_parallel": 2, "parallel_config.context_parallel_algo": "colossalai_cp"},
    "cp2_ulysses": {"parallel_config.context_parallel": 2, "parallel_config.context_parallel_algo": "ulysses_cp"},
    "pp2_1f1b": {**PP2, "parallel_config.micro_batch_num": 2, "runner_config.batch_size": GLOBAL_BATCH // 2,
                 "parallel.pipeline_config.pipeline_scheduler": "1f1b", "model.model_config.offset": "$pp_offset"},
    "pp2_dualpipev": {**PP2, "parallel_config.micro_batch_num": 4, "runner_config.batch_size": GLOBAL_BATCH // 4,
                      "parallel.pipeline_config.pipeline_scheduler": "dualpipev",
                      "parallel.pipeline_config.pipeline_interleave": 2,
                      "parallel.pipeline_config.layers_per_stage": "$v_split"},
    "ep2": {"parallel_config.data_parallel": 2, "parallel_config.expert_parallel": 2,
            "runner_config.batch_size": GLOBAL_BATCH // 2},
    "dp2_hsdp3": {"parallel_config.data_parallel": 2, "runner_config.batch_size": GLOBAL_BATCH // 2,
                  "parallel.enable_parallel_optimizer": True, "hsdp.optimizer_level": "level3", "hsdp.threshold": 0},
}
LAYOUT_NEEDS = {"ep2": "moe"}           # a layout only some models have (a cell that does not exist elsewhere)

MODES: Dict[str, int] = {"pynative": 1, "jit": 0}

# every cell and reference: 2 steps of 4 rows from the folder, AdamW with eps 1e-3 (an eps far below the root of
# the second moment lets rounding differences of near-zero gradients become whole-lr updates: AdamW's update is
# then ~ sign(g), and two exact runs can differ by 2 lr in such a weight), float32
BASE: Dict[str, Any] = {
    "seed": 1234, "run_mode": "finetune", "use_parallel": False,
    "context": {"mode": 1, "device_target": "CPU"},
    "parallel_config": {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1, "context_parallel": 1,
                        "micro_batch_num": 1, "use_seq_parallel": False},
    "model": {"model_config": {"compute_dtype": "float32", "param_init_dtype": "float32"}},
    "optimizer": {"type": "AdamW", "learning_rate": 5.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-3,
                  "weight_decay": 0.01},
    "lr_schedule": {"type": "ConstantWarmUpLR", "learning_rate": 5.0e-3, "warmup_steps": 0, "total_steps": STEPS},
    "runner_config": {"epochs": 1, "batch_size": GLOBAL_BATCH, "max_steps": STEPS, "gradient_accumulation_steps": 1},
    "callbacks": [{"type": "MFLossMonitor", "per_print_times": 1}],
}
FILTER_KEYS = ("feature", "model", "data", "layout", "mode")


@dataclass(frozen=True)
class Cell:
    feature: str
    model: str
    data: str
    layout: str
    mode: str

    @property
    def name(self) -> str:
        return "-".join((self.feature, self.model, self.data, self.layout, self.mode))

    @property
    def reference(self) -> str:
        """The one-process run this cell is compared with (shared by the layouts; a pipeline of a model whose
        aux loss is taken over the batch (``aux_loss``) has its own: see ``aux_groups``)."""
        m = aux_groups(self)
        return "-".join((self.feature, self.model, self.data, "one" if m == 1 else f"one_mb{m}", self.mode))

    def get(self, key: str) -> str:
        return getattr(self, key)


def cells(only: Optional[Dict[str, Sequence[str]]] = None) -> List[Cell]:
    """Every cell of the table, in table order; ``only`` keeps those whose keys take one of the given values."""
    out = []
    for feature in FEATURES:
        for model, spec in MODELS.items():
            for data in DATA:
                for mode in MODES:
                    for layout in LAYOUTS:
                        if LAYOUT_NEEDS.get(layout) == "moe" and not spec.moe:
                            continue
                        out.append(Cell(feature, model, data, layout, mode))
    if only:
        bad = [k for k in only if k not in FILTER_KEYS]
        if bad:
            raise ValueError(f"grid filter keys {bad}: valid keys are {list(FILTER_KEYS)}")
        table = {"feature": FEATURES, "model": MODELS, "data": DATA, "layout": LAYOUTS, "mode": MODES}
        for k, values in only.items():
            unknown = [v for v in values if v not in table[k]]
            if unknown:
                raise ValueError(f"grid filter {k}={'|'.join(values)}: {unknown} not in {list(table[k])}")
        out = [c for c in out if all(c.get(k) in v for k, v in only.items())]
    return out


def parse_only(text: Optional[str]) -> Dict[str, List[str]]:
    """``model=qwen3,mode=jit`` (``|`` between values of one key) -> ``{"model": ["qwen3"], "mode": ["jit"]}``."""
    only: Dict[str, List[str]] = {}
    for part in filter(None, (text or "").split(",")):
        if "=" not in part:
            raise ValueError(f"--only {text!r}: {part!r} is not key=value (keys {list(FILTER_KEYS)})")
        k, v = part.split("=", 1)
        only.setdefault(k.strip(), []).extend(x.strip() for x in v.split("|") if x.strip())
    return only


# ------------------------------------------------------------------------------------- YAML of a cell
def _set(raw: Dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _resolve(value: Any, names: Dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        head, _, tail = value[1:].partition("/")
        got = names[head]
        return os.path.join(got, tail) if tail else got
    if isinstance(value, dict):
        return {k: _resolve(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, names) for v in value]
    return value


def _apply(raw: Dict[str, Any], keys: Dict[str, Any], names: Dict[str, Any]) -> None:
    for k, v in keys.items():
        v = _resolve(v, names)
        if v is not None:
            _set(raw, k, v)


# models whose load-balancing loss takes f and P over the whole batch (aux_loss): a pipeline computes it per
# microbatch (as MindFormers' and Megatron's pipelines do; the whole batch is never on a stage at once), so their
# pipeline cells' reference takes it over the same row groups (model_config.moe_aux_loss_micro_batches)
AUX_LOSS_MODELS = ("qwen3_moe",)


def aux_groups(cell: Cell) -> int:
    """The row groups of ``cell``'s reference aux loss: the pipeline's micro_batch_num for an aux_loss model."""
    if cell.model not in AUX_LOSS_MODELS:
        return 1
    return int(LAYOUTS.get(cell.layout, {}).get("parallel_config.micro_batch_num", 1))


def with_mtp_layer(source: str, target: str) -> None:
    """``source`` (a DeepSeek-V3 folder made by transformers, which neither reads nor writes the MTP layers its
    config counts) with its MTP layers added as DeepSeek's released checkpoints store them: layer
    ``num_hidden_layers + k`` holds a copy of the last decoder layer's weights, ``enorm`` / ``hnorm`` /
    ``shared_head.norm`` (ones), ``eh_proj`` (normal, std 0.02, fixed seed) and copies of the embedding and the
    head. Full fine-tuning draws the weights a folder lacks; LoRA freezes every base weight, so each must be
    in the folder (the trainer's preflight refuses one that lacks any: ``model_builder.lora_base_problems``)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    with open(os.path.join(source, "config.json")) as f:
        hf = json.load(f)
    layers, depths, h = hf["num_hidden_layers"], int(hf.get("num_nextn_predict_layers") or 0), hf["hidden_size"]
    if depths < 1:
        raise ValueError(f"{source}: config.json num_nextn_predict_layers = {depths}: no MTP layer to add")
    tensors = load_file(os.path.join(source, "model.safetensors"))
    last = f"model.layers.{layers - 1}."
    rng = np.random.default_rng(20261128)
    dtype = tensors["model.embed_tokens.weight"].dtype
    for k in range(depths):
        mtp = f"model.layers.{layers + k}."
        for name in [n for n in tensors if n.startswith(last)]:
            tensors[mtp + name[len(last):]] = tensors[name].copy()
        for norm in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            tensors[mtp + norm] = np.ones((h,), dtype)
        tensors[mtp + "eh_proj.weight"] = (rng.standard_normal((h, 2 * h)) * 0.02).astype(dtype)
        tensors[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].copy()
        tensors[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].copy()
    from ..models.hf.export import staged_folder
    with staged_folder(target) as stage:
        shutil.copytree(source, stage, ignore=shutil.ignore_patterns("*.safetensors", "*.npz"), dirs_exist_ok=True)
        save_file(tensors, os.path.join(stage, "model.safetensors"), metadata={"format": "pt"})


DERIVED_FOLDERS: Dict[str, Callable[[str, str], None]] = {"with_mtp_layer": with_mtp_layer}


def folder_of(cell: Cell, work: str, fixtures: str = FIXTURES) -> str:
    """The Hugging Face folder ``cell`` (and its reference) loads: the model's fixture, or for LoRA its
    ``lora_folder`` derivation under ``work`` (made by :func:`prepare`)."""
    model = MODELS[cell.model]
    if cell.feature == "lora" and model.lora_folder:
        return os.path.join(work, "hf", f"{model.folder}_{model.lora_folder}")
    return os.path.join(fixtures, "hf", model.folder)


def config_of(cell: Cell, work: str, layout: Optional[str] = None, fixtures: str = FIXTURES) -> Dict[str, Any]:
    """The YAML (a dict) of ``cell``; ``layout="one"`` gives its reference (every parallel size 1)."""
    import copy
    layout = cell.layout if layout is None else layout
    model = MODELS[cell.model]
    folder = folder_of(cell, work, fixtures)
    names = {**model.values, "fixtures": fixtures, "work": work}
    raw = copy.deepcopy(BASE)
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = folder
    raw["context"]["mode"] = MODES[cell.mode]
    _apply(raw, model.keys, names)
    _apply(raw, FEATURES[cell.feature], names)
    _apply(raw, DATA[cell.data], names)
    if layout != "one":
        raw["use_parallel"] = True
        _apply(raw, LAYOUTS[layout], names)
    elif aux_groups(cell) > 1:
        _apply(raw, {"model.model_config.moe_aux_loss_micro_batches": aux_groups(cell)}, names)
    return raw


def write_config(raw: Dict[str, Any], path: str) -> str:
    import yaml
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def argv_of(config: str, out: str) -> List[str]:
    """The command line of a cell (or a reference): run_mindformer.py's flags."""
    return ["--config", config, "--output_dir", out, "--export_hf_dir", out + "_hf"]


def refusal(config_path: str, worker_num: int = WORKERS) -> Optional[str]:
    """The trainer's refusal of a YAML before any process group (the command line's validation and
    ``Trainer``'s preflight), or None when it would start."""
    from ..training.config import ConfigError, read_yaml, validate
    from ..training.trainer import Trainer
    try:
        config = validate(read_yaml(config_path), [], worker_num=worker_num, source=config_path)
        try:
            Trainer(config, worker_num=worker_num)
        except ConfigError as e:
            raise ConfigError([config.report.rename(x) for x in e.errors], config_path) from None
    except ConfigError as e:
        return "; ".join(str(x) for x in e.errors)
    return None


# ------------------------------------------------------------------------------------ the workers' side
def _guard():
    """The jit recompile guard the msrun worker installed (mindformers_core/testing/worker.py), or None."""
    try:
        from mindspore import log
        from .jit_guard import ConstantTupleGuard
    except ImportError:
        return None
    for h in log._get_logger().handlers:
        if isinstance(h, ConstantTupleGuard):
            return h
    return None


def run_cells(cells: List[List[Any]], results_dir: str, deadline: float = CELL_DEADLINE) -> Dict[str, Any]:
    """msrun body: ``cells`` is ``[[name, argv], ...]``; each runs the trainer's command line in turn, in this
    process. After each cell ``results_dir/<name>.rank<r>.json`` holds its exit code, seconds and CPU seconds.
    A cell raising writes its error there and raises (ends the launch: a peer may wait in a collective); a cell
    past ``deadline`` seconds writes ``hang`` and ends this process (a watchdog thread)."""
    from ..distributed import get_env
    from ..training.cli import main
    rank = get_env().rank
    os.makedirs(results_dir, exist_ok=True)
    guard = _guard()
    done = {}

    def write(name, record):
        path = os.path.join(results_dir, f"{name}.rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    for name, argv in cells:
        marker = f"[grid] cell {name} on rank {rank}"
        print(f"{marker}: start", flush=True)
        print(f"{marker}: start", file=sys.stderr, flush=True)
        start, start_cpu = time.monotonic(), time.process_time()
        finished = threading.Event()

        def watchdog(name=name, start=start):
            if not finished.wait(deadline):
                write(name, {"status": "hang", "error": f"cell still running after {deadline:.0f} s (deadline)",
                             "seconds": round(time.monotonic() - start, 1)})
                error_file = os.environ.get("MFC_ERROR_FILE")
                if error_file:
                    with open(error_file, "w") as f:
                        f.write(f"grid cell {name}: past its deadline of {deadline:.0f} s\n")
                print(f"{marker}: past its deadline of {deadline:.0f} s", file=sys.stderr, flush=True)
                os._exit(3)
        threading.Thread(target=watchdog, daemon=True, name=f"grid-watchdog-{name}").start()
        if guard is not None:
            guard.seen.clear()
        try:
            code = main(list(argv))
        except BaseException as e:        # noqa: BLE001 - recorded, then the launch ends
            finished.set()
            write(name, {"status": "error", "error": f"{type(e).__name__}: {first_line(str(e))}",
                         "traceback": traceback.format_exc()[-4000:],
                         "seconds": round(time.monotonic() - start, 1), "process_cpu": round(time.process_time(), 1)})
            raise
        finished.set()
        if code != 0:       # this rank stopped early: its peer may wait in a collective of this cell
            write(name, {"status": "exit", "code": code, "error": f"exit code {code}",
                         "seconds": round(time.monotonic() - start, 1), "process_cpu": round(time.process_time(), 1)})
            raise RuntimeError(f"grid cell {name}: the trainer's command line exited {code} on rank {rank}")
        record = {"status": "done", "code": code, "seconds": round(time.monotonic() - start, 1),
                  "cpu": round(time.process_time() - start_cpu, 1),
                  "process_cpu": round(time.process_time(), 1)}     # this worker's CPU since it started
        if guard is not None and guard.seen:
            record["recompiled"] = guard.report()
            guard.seen.clear()
        write(name, record)
        done[name] = record
        print(f"{marker}: exit {code} after {record['seconds']} s", flush=True)
    return done


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


# ------------------------------------------------------------------------------------ the launcher's side
@dataclass
class Outcome:
    status: str                    # "pass" | "refused" | "fail"
    reason: str = ""
    seconds: float = 0.0
    cpu: float = 0.0
    detail: Dict[str, Any] = field(default_factory=dict)
    logs: str = ""


def records(out: str) -> List[Dict[str, Any]]:
    path = os.path.join(out, "loss.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(out: str, ref: str, rtol: float = RTOL) -> Tuple[Optional[str], Dict[str, Any]]:
    """``None`` when ``out``'s losses (every step) and exported tensors are within ``rtol`` of ``ref``'s, else
    the first difference; and the measured worst relative differences."""
    import math
    import numpy as np
    from ..models.hf.folder import open_folder
    got, want = records(out), records(ref)
    detail: Dict[str, Any] = {}
    if len(want) != STEPS or not all(math.isfinite(r["loss"]) for r in want):
        return f"the one-process reference logged {[r.get('loss') for r in want]}", detail
    if len(got) != len(want):
        return f"logged {len(got)} step(s), the one process {len(want)}", detail
    worst = 0.0
    for a, b in zip(got, want):
        if not math.isfinite(a["loss"]):
            return f"step {a['step']}: loss {a['loss']}", detail
        err = abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12)
        worst = max(worst, err)
        if err > rtol:
            detail["loss"] = worst
            return (f"step {a['step']}: loss {a['loss']:.7f} against one process's {b['loss']:.7f} "
                    f"(relative {err:.1e})"), detail
    detail["loss"] = worst
    if not os.path.isdir(ref + "_hf"):
        return "the one-process reference wrote no export", detail
    if not os.path.isdir(out + "_hf"):
        return "no export written (--export_hf_dir)", detail
    a, b = open_folder(out + "_hf"), open_folder(ref + "_hf")
    if sorted(a.tensors) != sorted(b.tensors):
        missing, extra = sorted(set(b.tensors) - set(a.tensors)), sorted(set(a.tensors) - set(b.tensors))
        return f"export holds other tensors: missing {missing[:3]}, extra {extra[:3]}", detail
    worst, where = 0.0, ""
    with a.reader() as ra, b.reader() as rb:
        for t in sorted(b.tensors):
            x, y = np.asarray(ra(t), np.float64), np.asarray(rb(t), np.float64)
            if x.shape != y.shape:
                return f"export: {t} has shape {x.shape}, one process {y.shape}", detail
            err = float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)) if y.size else 0.0
            if not np.isfinite(err):
                return f"export: {t} holds non-finite values", detail
            if err > worst:
                worst, where = err, t
    detail["weights"] = worst
    if worst > rtol:
        return f"export: {where} differs by {worst:.1e} of its largest magnitude", detail
    return None, detail


def cell_log(log_dir: str, name: str, nproc: int = WORKERS, lines: int = 30) -> str:
    """Each rank's log from the start of ``name`` (its marker line), the last ``lines`` lines."""
    parts = []
    for r in range(nproc):
        path = os.path.join(log_dir, f"worker_{r}.log")
        try:
            with open(path, errors="replace") as f:
                text = f.read().splitlines()
        except OSError as e:
            parts.append(f"--- rank {r}: no log ({e})")
            continue
        marks = [i for i, line in enumerate(text) if f"[grid] cell {name} on rank" in line]
        seg = text[marks[0]:] if marks else text
        parts.append(f"--- rank {r} ({path}) ---\n" + "\n".join(seg[-lines:]))
    return "\n".join(parts)


def _first_error(seg: List[str]) -> str:
    """The first error of a log segment: the exception line of its first traceback, or a line naming an error."""
    for i, line in enumerate(seg):
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(seg) and (seg[j].startswith((" ", "\t")) or not seg[j].strip()):
                j += 1
            if j < len(seg):
                return seg[j].strip()[:500]
        if "invalid configuration" in line:       # then "N problem(s) in ...:" and one line per problem
            problems = [x.strip() for x in seg[i + 1:i + 4] if x.strip()][:3]
            return " ".join([line.strip(), *problems])[:500]
        if re.search(r"training stopped|past its deadline", line):
            return line.strip()[:400]
    return ""


def error_line_of(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return _first_error(f.read().splitlines())
    except OSError:
        return ""


def error_line(log_dir: str, name: str, nproc: int = WORKERS, first: Sequence[int] = ()) -> str:
    """The first error line of a failing cell in the rank logs (after the cell's marker), with its rank; the ranks
    in ``first`` (those that reported the error) are read first."""
    for r in [*first, *(q for q in range(nproc) if q not in first)]:
        try:
            with open(os.path.join(log_dir, f"worker_{r}.log"), errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            continue
        marks = [i for i, line in enumerate(text) if f"[grid] cell {name} on rank" in line]
        found = _first_error(text[marks[0]:] if marks else text)
        if found:
            return f"rank {r}: {found}"
    return ""


@dataclass
class GridRun:
    """What :func:`run_grid` measured: each cell's outcome, the launches, wall and CPU seconds."""
    outcomes: Dict[str, Outcome]
    launches: int = 0
    wall: float = 0.0
    worker_cpu: float = 0.0
    reference_wall: float = 0.0
    reference_cpu: float = 0.0
    parent_cpu: float = 0.0


def prepare(selected: Sequence[Cell], work: str, fixtures: str = FIXTURES) -> Tuple[Dict[str, str], Dict[str, str],
                                                                                   Dict[str, str]]:
    """Write every cell's and reference's YAML under ``work`` (and the plain-text corpus); find the refused cells
    (the trainer's preflight, here, before any worker). Returns (cell -> refusal), (cell -> YAML path of the
    launched cells), (reference -> YAML path)."""
    from ..data.corpus import build_corpus
    os.makedirs(work, exist_ok=True)
    if any(c.data == "plain" for c in selected) and not os.path.isfile(os.path.join(work, "corpus.txt")):
        build_corpus(os.path.join(work, "corpus.txt"), max_bytes=20_000)
    for c in selected:
        folder, model = folder_of(c, work, fixtures), MODELS[c.model]
        if not os.path.isdir(folder):
            DERIVED_FOLDERS[model.lora_folder](os.path.join(fixtures, "hf", model.folder), folder)
    refused, launched, refs = {}, {}, {}
    for c in selected:
        path = write_config(config_of(c, work, fixtures=fixtures), os.path.join(work, "yaml", c.name + ".yaml"))
        why = refusal(path)
        if why is not None:
            refused[c.name] = why
            continue
        launched[c.name] = path
        if c.reference not in refs:
            refs[c.reference] = write_config(config_of(c, work, layout="one", fixtures=fixtures),
                                             os.path.join(work, "yaml", c.reference + ".yaml"))
    return refused, launched, refs


def run_reference(name: str, config: str, work: str) -> Optional[str]:
    """The one-process run (in this process); None, or why it failed."""
    from ..training.cli import main
    out = os.path.join(work, "out", name)
    if os.path.isfile(os.path.join(out, "loss.jsonl")) and os.path.isdir(out + "_hf"):
        return None
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out + "_hf", ignore_errors=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with _output_to(out + ".log"):
        try:
            code = main(argv_of(config, out))
        except Exception:          # noqa: BLE001
            traceback.print_exc()
            code = None
    if code == 0:
        return None
    why = error_line_of(out + ".log")
    return f"the one-process reference {'raised' if code is None else f'exited {code}'}" + (f": {why}" if why else "")


class _output_to:
    """This process's stdout and stderr (the file descriptors: MindSpore's C++ logs too) into ``path``."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        self.file = open(self.path, "a")
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        self.file.close()
        return False


def launch_cells(specs: List[List[Any]], work: str, deadline: float = CELL_DEADLINE,
                 log: Callable[[str], None] = print) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, str], int, float]:
    """Run ``specs`` ([[name, argv], ...]) in batched 2-worker launches until each cell has run or failed: a
    failing cell ends its launch, the cells after it go to a new one. Returns (cell -> per-rank records),
    (cell -> its log excerpt when it failed), the number of launches and the workers' CPU seconds (each worker
    process's own, from its start to its last cell)."""
    from .msrun import MsrunError, run_msrun
    results_dir = os.path.join(work, "cells")
    os.makedirs(results_dir, exist_ok=True)
    per_cell: Dict[str, Dict[str, Any]] = {}
    logs: Dict[str, str] = {}
    todo = list(specs)
    launches, wall, cpu = 0, 0.0, 0.0
    while todo:
        launches += 1
        launch_dir = os.path.join(work, f"launch_{launches}")
        start = time.monotonic()
        log(f"[grid] launch {launches}: {len(todo)} cell(s) on {WORKERS} workers")
        error = None
        try:
            run_msrun(f"{__name__}:run_cells", WORKERS, kwargs={"cells": todo, "results_dir": results_dir,
                                                               "deadline": deadline},
                      timeout=deadline * len(todo) + 120, work_dir=launch_dir, keep=True)
        except MsrunError as e:
            error = str(e)
        wall += time.monotonic() - start
        last_cpu = {}       # rank -> the worker's process CPU at its last record of this launch
        for name, _ in todo:
            for r in range(WORKERS):
                path = os.path.join(results_dir, f"{name}.rank{r}.json")
                if os.path.isfile(path):
                    with open(path) as f:
                        last_cpu[r] = max(last_cpu.get(r, 0.0), json.load(f).get("process_cpu", 0.0))
        cpu += sum(last_cpu.values())
        rest = []
        for i, (name, argv) in enumerate(todo):
            recs = {}
            for r in range(WORKERS):
                path = os.path.join(results_dir, f"{name}.rank{r}.json")
                if os.path.isfile(path):
                    with open(path) as f:
                        recs[r] = json.load(f)
            complete = len(recs) == WORKERS and all(x["status"] == "done" for x in recs.values())
            if complete:
                per_cell[name] = recs
                continue
            if error is None:
                per_cell[name] = recs or {0: {"status": "error", "error": "no result written"}}
                continue
            # the first cell without a result on every rank is the one that ended the launch
            if not any(n in per_cell for n, _ in todo[i + 1:]):
                recs = recs or {}
                bad = [r for r, x in sorted(recs.items()) if x.get("status") != "done"]
                line = error_line(os.path.join(launch_dir, "logs"), name, first=bad) or next(
                    (f"rank {r}: {x.get('error')}" for r, x in sorted(recs.items()) if x.get("status") != "done"),
                    first_line(error))
                recs["failed"] = line
                per_cell[name] = recs
                logs[name] = cell_log(os.path.join(launch_dir, "logs"), name)
                rest = todo[i + 1:]
            break
        failed = [n for n, _ in todo if "failed" in per_cell.get(n, {})]
        log(f"[grid] launch {launches} took {time.monotonic() - start:.0f} s"
            + (f"; {failed[-1]} failed ({per_cell[failed[-1]]['failed'][:200]})" if failed else "")
            + (f"; the {len(rest)} cell(s) after it go to a new launch" if rest else ""))
        todo = rest
    return per_cell, logs, launches, cpu


def run_grid(selected: Sequence[Cell], work: Optional[str] = None, deadline: float = CELL_DEADLINE,
             fixtures: str = FIXTURES, log: Callable[[str], None] = print) -> GridRun:
    """Run ``selected``: refusals found here, the launched cells on the workers (in a thread) while this
    process runs their one-process references, then the comparisons."""
    import concurrent.futures
    work = work or tempfile.mkdtemp(prefix="mfc_grid_")
    t0, cpu0 = time.monotonic(), time.process_time()
    refused, launched, refs = prepare(selected, work, fixtures)
    log(f"[grid] {len(selected)} cell(s): {len(refused)} refused by the preflight, {len(launched)} to launch, "
        f"{len(refs)} one-process reference(s); work dir {work}")
    specs = [[name, argv_of(path, os.path.join(work, "out", name))] for name, path in launched.items()]
    outcomes: Dict[str, Outcome] = {n: Outcome("refused", why) for n, why in refused.items()}
    run = GridRun(outcomes)
    if specs:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        future = pool.submit(launch_cells, specs, work, deadline, log)
        r0, rc0 = time.monotonic(), time.process_time()
        ref_errors = {}
        for name, path in refs.items():
            s = time.monotonic()
            ref_errors[name] = run_reference(name, path, work)
            log(f"[grid] reference {name}: {ref_errors[name] or 'done'} ({time.monotonic() - s:.0f} s)")
        run.reference_wall, run.reference_cpu = time.monotonic() - r0, time.process_time() - rc0
        per_cell, logs, run.launches, run.worker_cpu = future.result()
        pool.shutdown()
        by_name = {c.name: c for c in selected}
        for name, recs in per_cell.items():
            cell = by_name[name]
            seconds = max((x.get("seconds", 0.0) for k, x in recs.items() if k != "failed"), default=0.0)
            cpu = sum(x.get("cpu", 0.0) for k, x in recs.items() if k != "failed")
            if "failed" in recs:
                outcomes[name] = Outcome("fail", recs["failed"], seconds, cpu, logs=logs.get(name, ""))
                continue
            codes = {r: x.get("code") for r, x in recs.items()}
            if any(c != 0 for c in codes.values()):
                line = error_line(os.path.join(work, "launch_1", "logs"), name)
                for i in range(2, run.launches + 1):
                    line = line or error_line(os.path.join(work, f"launch_{i}", "logs"), name)
                outcomes[name] = Outcome("fail", f"exit codes {codes}" + (f": {line}" if line else ""), seconds, cpu)
                continue
            recompiled = next((x["recompiled"] for x in recs.values() if x.get("recompiled")), None)
            if ref_errors.get(cell.reference):
                outcomes[name] = Outcome("fail", ref_errors[cell.reference], seconds, cpu)
                continue
            why, detail = compare(os.path.join(work, "out", name), os.path.join(work, "out", cell.reference))
            if why is None and recompiled:
                why = "a jit function recompiled at every call: " + first_line(recompiled)
            outcomes[name] = Outcome("fail" if why else "pass", why or "", seconds, cpu, detail)
    run.wall = time.monotonic() - t0
    run.parent_cpu = time.process_time() - cpu0
    return run


# ------------------------------------------------------------------------------------------- the table
def summary(outcomes: Dict[str, Outcome]) -> Dict[str, int]:
    counts = {"pass": 0, "refused": 0, "fail": 0}
    for o in outcomes.values():
        counts[o.status] += 1
    return counts


def _key(reason: str) -> str:
    """A reason without its rank ("rank 1: X" and "rank 0: X" are one reason in the table), its first 300
    characters."""
    return re.sub(r"^rank \d+: ", "", reason)[:300]


def _reasons(outcomes: Dict[str, Outcome], status: str) -> List[str]:
    return list(dict.fromkeys(_key(o.reason) for o in outcomes.values() if o.status == status))


def markdown(selected: Sequence[Cell], outcomes: Dict[str, Outcome]) -> str:
    """The grid as a markdown table: a row per (feature, model, data, mode), a column per layout; ✔ = one
    process, "refused Rn" / "✘ Fn" with the reasons listed below the table; blank: not run."""
    refused, failed = _reasons(outcomes, "refused"), _reasons(outcomes, "fail")
    layouts = [l for l in LAYOUTS if any(c.layout == l for c in selected)]
    head = "| feature | model | data | mode | " + " | ".join(layouts) + " |"
    lines = [head, "|" + "---|" * (4 + len(layouts))]
    rows: Dict[Tuple[str, str, str, str], Dict[str, str]] = {}
    for c in selected:
        row = rows.setdefault((c.feature, c.model, c.data, c.mode), {})
        o = outcomes.get(c.name)
        if o is None:
            row[c.layout] = ""
        elif o.status == "pass":
            row[c.layout] = "✔"
        elif o.status == "refused":
            row[c.layout] = f"refused R{refused.index(_key(o.reason)) + 1}"
        else:
            row[c.layout] = f"✘ F{failed.index(_key(o.reason)) + 1}"
    for key, row in rows.items():
        cells_ = [row.get(l, "n/a" if LAYOUT_NEEDS.get(l) == "moe" and not MODELS[key[1]].moe else "")
                  for l in layouts]
        lines.append("| " + " | ".join(key) + " | " + " | ".join(cells_) + " |")
    counts = summary(outcomes)
    lines.append("")
    lines.append(f"{len(outcomes)} cells: {counts['pass']} ✔ (= one process), {counts['refused']} refused by name "
                 f"before any process group, {counts['fail']} ✘ failing. n/a: expert parallelism needs a mixture "
                 "of experts.")
    if refused:
        lines.append("")
        lines.append("Refused (the preflight's words):")
        lines.append("")
        lines += [f"- R{i + 1}: {_md(r)}" for i, r in enumerate(refused)]
    if failed:
        lines.append("")
        lines.append("Failing (the first error line of the failing rank, or the first difference from one process):")
        lines.append("")
        lines += [f"- F{i + 1}: {_md(r)}" for i, r in enumerate(failed)]
    return "\n".join(lines)


def _md(text: str) -> str:
    text = text.replace(ROOT + os.sep, "").replace("|", "\\|").replace("\n", " ")   # paths relative to the repository
    return f"`{text}`" if "`" not in text else text


def text_table(selected: Sequence[Cell], outcomes: Dict[str, Outcome]) -> str:
    """One line per cell (for the console)."""
    out = []
    for c in selected:
        o = outcomes.get(c.name)
        if o is None:
            continue
        mark = {"pass": "PASS", "refused": "REFUSED", "fail": "FAIL"}[o.status]
        extra = ""
        if o.status == "pass":
            extra = f"loss {o.detail.get('loss', 0):.1e}, weights {o.detail.get('weights', 0):.1e}"
        out.append(f"{mark:8s} {c.name:45s} {o.seconds:6.1f}s  {extra or o.reason}")
    return "\n".join(out)


def to_json(outcomes: Dict[str, Outcome]) -> Dict[str, Any]:
    return {n: {"status": o.status, "reason": o.reason, "seconds": o.seconds, "cpu": o.cpu, "detail": o.detail}
            for n, o in outcomes.items()}


def from_json(data: Dict[str, Any]) -> Dict[str, Outcome]:
    return {n: Outcome(d["status"], d.get("reason", ""), d.get("seconds", 0.0), d.get("cpu", 0.0),
                       d.get("detail", {})) for n, d in data.items()}
