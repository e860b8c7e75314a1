"""MindFormers' two YAML dialects read into the one internal config the trainer uses.

- **graph mode** (``parallel_config``, ``runner_config``, ``model.model_config``, ``lr_schedule``,
  ``callbacks``, ``context``, ``parallel``, ...): the schema's own dialect, plus the keys real files
  carry — mcore/HF model names (``num_hidden_layers``, ``num_key_value_heads``, ...), ``data_loader``,
  ``beta1``/``beta2``, and the many Ascend/graph-mode keys that do nothing on CPU.
- **PyNative TrainConfig** (``training``, ``parallelism``, ``lr_scheduler``, ``checkpoint``, flat
  ``model`` with ``model_type``/``architectures``, ``train_dataset.dataloader``, ``monitor``,
  ``profiler``): translated key by key into the schema's keys.

Which keys are applied, listed as not applied on CPU, or refused is the data table in
:mod:`.mindformers_keys`. :func:`translate` returns the schema-dialect mapping, the keys not applied,
the errors found, and how to name a schema key as the user wrote it (``Report.rename``), so every error
names the key of the user's file. Pure Python: no MindSpore.
"""
from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import mindformers_keys as K
from .schema import Section, iter_fields, lookup

GRAPH, PYNATIVE = "graph", "pynative"
PYNATIVE_SECTIONS = ("training", "parallelism", "lr_scheduler")
_MISSING = object()
_EMPTY = ("", None, "None")

# schema key -> its PyNative name, for errors about keys the file does not have (defaults, required keys)
_PYNATIVE_NAMES = {**{v: k for k, v in K.PYNATIVE_ALIASES.items() if k.count(".") and not k.startswith("train_dataset.dataloader.dataset_files")},
                   "model.model_config.num_layers": "model.num_hidden_layers",
                   "model.model_config.num_heads": "model.num_attention_heads",
                   "model.model_config.n_kv_heads": "model.num_key_value_heads",
                   "model.model_config.ffn_hidden_size": "model.intermediate_size",
                   "model.model_config.param_init_dtype": "model.params_dtype",
                   "model.arch.type": "model.architectures",
                   "runner_config.gradient_accumulation_steps": "training.global_batch_size",
                   "parallel_config.micro_batch_num": "training.global_batch_size",
                   "parallel_config": "parallelism"}


def detect(raw: Dict[str, Any]) -> str:
    """``pynative`` when the file has a TrainConfig section (``training``, ``parallelism``,
    ``lr_scheduler``), a flat ``model`` (``model_type``/``architectures``/sizes, no ``model_config``)
    or ``train_dataset.dataloader``; else ``graph``."""
    if any(k in raw for k in PYNATIVE_SECTIONS):
        return PYNATIVE
    model = raw.get("model")
    if isinstance(model, dict) and model and "model_config" not in model and "arch" not in model:
        return PYNATIVE
    ds = raw.get("train_dataset")
    if isinstance(ds, dict) and "dataloader" in ds and "data_loader" not in ds:
        return PYNATIVE
    return GRAPH


@dataclass
class Report:
    """What the translation found: the dialect, keys not applied (``(user key, reason)``), and the
    user's name for each schema key it set."""
    dialect: str = GRAPH
    not_applied: List[Tuple[str, str]] = field(default_factory=list)
    origin: Dict[str, str] = field(default_factory=dict)     # schema path -> user path

    def rename(self, message: str) -> str:
        """``message`` with schema key paths written as the user's file writes them."""
        names = dict(_PYNATIVE_NAMES) if self.dialect == PYNATIVE else {}
        names.update(self.origin)
        names = {k: v for k, v in names.items() if k != v}
        if self.dialect == PYNATIVE:
            message = re.sub(r"(?<![\w.])model\.model_config\.(\w+)",
                             lambda m: names.get(m.group(0), f"model.{m.group(1)}"), message)
        if self.dialect == PYNATIVE and message.startswith("parallel_config = data_parallel"):
            message = "parallelism" + message[len("parallel_config"):]
            for ours, theirs in (("data_parallel ", "data_parallel_shard "), ("model_parallel ", "tensor_parallel "),
                                 ("pipeline_stage ", "pipeline_parallel ")):
                message = message.replace(ours, theirs, 1)
            return message
        if not names:
            return message
        pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
                             + r")(?![\w])")
        return pattern.sub(lambda m: names[m.group(1)], message)

    def summary(self, source: str = "the config") -> List[str]:
        """The start-up lines: keys known to MindFormers that do nothing here, grouped by reason."""
        if not self.not_applied:
            return []
        groups: Dict[str, List[str]] = {}
        for key, reason in self.not_applied:
            if key not in groups.setdefault(reason, []):
                groups[reason].append(key)
        lines = [f"not applied on CPU ({len(self.not_applied)} keys of {source}, known to MindFormers, accepted):"]
        lines += [f"  {reason}: {', '.join(keys)}" for reason, keys in groups.items()]
        return lines


# ------------------------------------------------------------------------------------------------ patterns
def _match(path: str, table: Dict[str, Any]) -> Optional[Any]:
    """The table entry for ``path``: exact, or a ``prefix.*`` pattern covering it (callbacks[i] -> callbacks)."""
    path = re.sub(r"\[\d+\]", "", path)
    if path in table:
        return table[path]
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        star = ".".join(parts[:i]) + ".*"
        if star in table:
            return table[star]
    return None


def known_paths(dialect: str) -> List[str]:
    """Every key path a file of ``dialect`` may hold (for suggestions): schema keys (graph mode) and the table's."""
    if dialect == PYNATIVE:
        keys = list(K.PYNATIVE_ALIASES) + list(K.PYNATIVE_NOT_APPLIED) + [k for k in K.PYNATIVE_SPECIAL]
        keys += [f"model.{k}" for k in _model_names()]
        keys += [f"eval_dataset.{p}" for p, _ in iter_fields(lookup("eval_dataset"))]
        keys += [f"callbacks.{p}" for p, _ in iter_fields(lookup("callbacks"))]
    else:
        keys = [p for p, _ in iter_fields()] + list(K.GRAPH_ALIASES) + list(K.GRAPH_NOT_APPLIED)
        keys += list(K.GRAPH_SPECIAL)
        keys += [f"model.model_config.{k}" for k in _model_names()]
        keys += [f"moe_config.{k}" for k in (*K.MOE_CONFIG_KEYS, *K.MOE_CONFIG_CHECKED, *K.MOE_CONFIG_NOT_APPLIED)]
    return sorted({k[:-2] if k.endswith(".*") else k for k in keys})


def _model_names() -> List[str]:
    own = list(lookup("model.model_config").fields)
    return own + list(K.MODEL_ALIASES) + list(K.MODEL_CHECKED) + list(K.MODEL_NOT_APPLIED) + \
        [K.PRE_SOFTMAX, K.AUTO_REGISTER]


def suggest(path: str, dialect: str) -> Optional[str]:
    """The known key most like ``path``: same name elsewhere, a similar sibling, a similar name, a similar path."""
    paths = known_paths(dialect)
    parent, _, name = re.sub(r"\[\d+\]", "", path).rpartition(".")
    by_leaf: Dict[str, str] = {}
    for p in sorted(paths, key=lambda p: p.count(".")):
        by_leaf.setdefault(p.rpartition(".")[2], p)
    parents = {p.rpartition(".")[0] for p in paths}
    if parent and parent not in parents:                            # a misspelt section: the closest full path
        close = difflib.get_close_matches(path, paths, n=1, cutoff=0.8)
        if close:
            return close[0]
    if name in by_leaf and by_leaf[name] != path:
        return by_leaf[name]
    siblings = [p.rpartition(".")[2] for p in paths if p.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    close = difflib.get_close_matches(name, list(by_leaf), n=1, cutoff=0.75)
    if close:
        return by_leaf[close[0]]
    close = difflib.get_close_matches(path, paths, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown(path: str, value: Any, dialect: str, what: str = "unknown key") -> str:
    s = suggest(path, dialect)
    return f"{path} = {value!r}: {what}" + (f"; did you mean {s!r}?" if s else "")


# ------------------------------------------------------------------------------------------------ helpers
def _get(tree: Dict[str, Any], path: str, default: Any = _MISSING) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _set(tree: Dict[str, Any], path: str, value: Any) -> None:
    node = tree
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _schema_field(path: str) -> bool:
    node = lookup(path)
    return node is not None and not isinstance(node, Section)


def _walk(tree: Any, prefix: str = "", stop=lambda path: False) -> Iterable[Tuple[str, Any]]:
    """(path, value) of every leaf; an empty mapping, or a path where ``stop(path)``, is a leaf."""
    if isinstance(tree, dict) and tree and not (prefix and stop(prefix)):
        for k, v in tree.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k), stop)
    else:
        yield prefix, tree


class _Translation:
    def __init__(self, dialect: str):
        self.report = Report(dialect)
        self.errors: List[str] = []
        self.out: Dict[str, Any] = {}
        self.given: Dict[str, Tuple[str, Any]] = {}        # schema path -> (user path, value) that set it
        self.auto_register_arch: Optional[Tuple[str, Any]] = None      # (user key, 'module.Class')
        self.auto_register_config: Optional[Tuple[str, Any]] = None

    def skip(self, path: str, reason: str) -> None:
        self.report.not_applied.append((re.sub(r"\[\d+\]", "", path), reason))

    def put(self, target: str, value: Any, user: str) -> None:
        """Set schema key ``target`` from ``user``; two user keys naming one setting must agree."""
        value = K.VALUE_ALIASES.get(target, {}).get(value, value) if _hashable(value) else value
        if target in self.given:
            other, old = self.given[target]
            if old != value:
                self.errors.append(f"{user} = {value!r}: conflicts with {other} = {old!r}; they are the same "
                                   "setting, give one")
            return
        self.given[target] = (user, value)
        self.report.origin[target] = user
        _set(self.out, target, value)

    # ---- model keys (both dialects) ----------------------------------------------------------------
    def lora(self, value: Any, user: str) -> None:
        """LoRA settings (graph ``model.model_config.pet_config``, PyNative ``lora_config``): checked here, before
        any process group, then kept as ``model.model_config.pet_config`` (peft/config.py reads both spellings)."""
        from ..peft.config import LoraConfigError, parse_lora
        try:
            parse_lora(value, user)
        except LoraConfigError as e:
            self.errors.append(str(e))
            return
        self.put("model.model_config.pet_config", dict(value, pet_type="lora"), user)

    def yarn(self, keys: Dict[str, Any], prefix: str) -> None:
        """MindFormers' flat YaRN keys (``position_embedding_type: yarn``, ``rotary_scaling_factor``, ``beta_fast``,
        ...) -> ``model.model_config.rope_scaling`` (config.json's mapping; the model checks its values)."""
        given = {K.YARN_FLAT[k]: v for k, v in keys.items() if k in K.YARN_FLAT and v is not None}
        if keys.get("position_embedding_type") != "yarn":
            for k, v in keys.items():
                if k in K.YARN_FLAT and v is not None:
                    self.errors.append(f"{prefix}{k} = {v!r}: a YaRN setting, read only with "
                                       f"{prefix}position_embedding_type: yarn")
            return
        if "factor" not in given:
            self.errors.append(f"{prefix}position_embedding_type = 'yarn': needs {prefix}rotary_scaling_factor "
                               "(the context extension factor)")
            return
        given.setdefault("original_max_position_embeddings", K.YARN_ORIGINAL_DEFAULT)
        self.put("model.model_config.rope_scaling", dict(type="yarn", **given), f"{prefix}position_embedding_type")

    def model(self, keys: Dict[str, Any], prefix: str, own: Iterable[str]) -> None:
        """``keys`` of one model section (``model.model_config`` or PyNative ``model``)."""
        own = set(own)
        self.yarn(keys, prefix)
        for name, value in keys.items():
            user = f"{prefix}{name}"
            if name in K.YARN_FLAT or (name == "position_embedding_type" and value == "yarn"):
                continue                                  # read by yarn() above
            if name == "offset" and isinstance(value, list) and value and all(isinstance(v, list) for v in value):
                value = [o for chunk in value for o in chunk]    # per virtual stage lists -> stage order
            if name == "moe_token_drop_policy" and (value in (False, None) or (
                    value == "probs" and keys.get("moe_expert_capacity_factor") in (None, -1))):
                self.skip(user, K.MISC)                  # "no drop policy", or dropless routing: nothing is dropped
            elif name == "use_flash_attention" and value is True:
                self.put("model.model_config.use_flash_attention", value, user)
                self.skip(user, K.UNFUSED)
            elif name == "pet_config" and value is not None:
                self.lora(value, user)
            elif name == K.AUTO_REGISTER:
                self.auto_register_config = (user, value)
            elif name == K.PRE_SOFTMAX:
                if value is True or value is None:
                    self.skip(user, "the router's softmax is over every expert before the top-k (as given)")
                elif value is False:                     # softmax over the k chosen = the renormalized top k
                    self.put("model.model_config.norm_topk_prob", True, user)
                else:
                    self.errors.append(f"{user} = {value!r}: must be True or False")
            elif name in own:
                self.put(f"model.model_config.{name}", value, user)
            elif name in K.MODEL_ALIASES:
                if value in _EMPTY and name != "untie_embeddings_and_output_weights":
                    continue
                self.put(f"model.model_config.{K.MODEL_ALIASES[name]}", (not value) if name in K.NEGATED else value,
                         user)
            elif name in K.MODEL_CHECKED:
                ok, why = K.MODEL_CHECKED[name]
                if _hashable(value) and value in ok:
                    self.skip(user, K.KERNELS if name in ("rmsnorm", "post_layer_norm") else K.MISC)
                else:
                    self.errors.append(f"{user} = {value!r}: {why}")
            elif user in K.GRAPH_ALIASES:
                self.put(K.GRAPH_ALIASES[user], value, user)
            elif name in K.MODEL_NOT_APPLIED:
                self.skip(user, K.MODEL_NOT_APPLIED[name])
            elif self.report.dialect == GRAPH:
                _set(self.out, f"model.model_config.{name}", value)     # the schema check names it, in order
            else:
                self.errors.append(unknown(user, value, self.report.dialect))

    def grouped_moe_factors(self) -> bool:
        """The file's ``moe_config`` runs MindFormers' grouped-matmul MoE (``use_gmm: True``) with a per-type
        factor list (``aux_loss_factors``)."""
        block = self.moe_block if isinstance(getattr(self, "moe_block", None), dict) else {}
        return block.get("use_gmm") is True and block.get("aux_loss_factors") not in _EMPTY

    def moe_config(self, path: str, value: Any) -> None:
        """A key of DeepSeek-V3's graph-mode ``moe_config`` block, read into ``model.model_config``."""
        name = path.split(".", 1)[1]
        if name in K.MOE_CONFIG_KEYS:
            if _hashable(value) and value in _EMPTY:
                return
            if name == "aux_loss_factor" and self.grouped_moe_factors():
                # MindFormers' grouped-matmul MoE (MoEV3, use_gmm) takes its expert load-balancing factor from
                # aux_loss_factors at aux_loss_types' 'expert'; the single aux_loss_factor is the older router's
                self.skip(path, K.MOE_V3_FACTOR)
                return
            if name == "expert_num" and isinstance(value, int) and not isinstance(value, bool) and value <= 1:
                self.skip(path, K.MISC)                                  # one expert: a dense model
                return
            if name == "use_gating_sigmoid":
                if not isinstance(value, bool):
                    self.errors.append(f"{path} = {value!r}: must be True (sigmoid scores) or False (softmax)")
                    return
                value = "sigmoid" if value else "softmax"
            if name == "aux_loss_factors":
                if not isinstance(value, list) or len(value) != 1:
                    self.errors.append(f"{path} = {value!r}: one factor is expected (the expert load-balancing "
                                       "loss, aux_loss_types ['expert'])")
                    return
                value = value[0]
            self.put(f"model.model_config.{K.MOE_CONFIG_KEYS[name]}", value, path)
        elif name in K.MOE_CONFIG_CHECKED:
            ok, why = K.MOE_CONFIG_CHECKED[name]
            items = value if isinstance(value, list) else [value]
            if all(_hashable(v) and v in ok for v in items):
                self.skip(path, K.MISC)
            else:
                self.errors.append(f"{path} = {value!r}: {why}")
        elif name in K.MOE_CONFIG_NOT_APPLIED:
            self.skip(path, K.MOE_CONFIG_NOT_APPLIED[name])
        else:
            self.errors.append(unknown(path, value, GRAPH))

    def columns(self, user: str, value: Any) -> None:
        if not isinstance(value, list) or "input_ids" not in value:
            self.errors.append(f"{user} = {value!r}: must be a list holding 'input_ids' (the token column read; "
                               "labels are the inputs shifted by one)")
        elif user == "train_dataset.input_columns":
            self.put(user, value, user)          # the batch keys fed (HFDataLoader: loss_mask, position_ids, ...)
        else:
            self.skip(user, K.LOADER)

    def loader_type(self, user: str, value: Any, target: str) -> None:
        if value in K.LOADERS_NOT_IMPLEMENTED:
            self.errors.append(f"{user} = {value!r}: this data loader is not implemented here; use HFDataLoader "
                               "(local json/jsonl/parquet/csv/arrow files through the datasets library), MindDataset "
                               "(a MindRecord directory from scripts/preprocess_mindrecord.py), "
                               "BlendedMegatronDatasetDataLoader (.bin/.idx from scripts/preprocess_megatron.py) or set "
                               f"{target} to text/jsonl with a dataset_dir")
        else:
            self.put(target, value, user)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ graph mode
def _graph(raw: Dict[str, Any]) -> Tuple[Dict[str, Any], _Translation]:
    t = _Translation(GRAPH)
    raw = copy.deepcopy(raw)
    t.moe_block = raw.get("moe_config")
    model_cfg = _get(raw, "model.model_config", None)
    mc_own = list(lookup("model.model_config").fields)
    leaves = list(_walk({k: v for k, v in raw.items() if k not in ("callbacks", "model")}, stop=_schema_field))
    for path, value in leaves:
        section = path.split(".")[0]
        if path == "parallel.pipeline_config.pipeline_interleave" and isinstance(value, bool):
            t.vpp_flag = value
        elif section == "moe_config":
            t.moe_config(path, value)
        elif path == "train_dataset.input_columns":
            t.columns(path, value)                                  # checked, then applied (HFDataLoader's batch keys)
        elif lookup(path) is not None and not isinstance(lookup(path), Section):
            reason = _match(path, K.GRAPH_NOT_APPLIED)
            if reason is not None:
                t.skip(path, reason)
            t.put(path, value, path)
        elif path in K.GRAPH_ALIASES:
            target = K.GRAPH_ALIASES[path]
            if path.endswith(".data_loader.type"):
                t.loader_type(path, value, target)
            elif path in ("optimizer.beta1", "optimizer.beta2"):
                continue                                            # below, as one pair
            elif value not in _EMPTY:
                t.put(target, value, path)
        elif path.endswith(".input_columns") and section in ("train_dataset", "eval_dataset"):
            t.columns(path, value)
        elif path == "do_eval":
            if value is True:
                t.do_eval = True
            elif value is not False:
                t.errors.append(f"do_eval = {value!r}: must be True or False")
        elif path == "lr_schedule.power":
            if value not in (1, 1.0):
                t.errors.append(f"lr_schedule.power = {value!r}: only power 1.0 (linear decay to lr_end) is "
                                "implemented for polynomial")
            else:
                t.skip(path, K.WRAPPER)
        elif path == "runner_wrapper.use_clip_grad" and value is False:
            t.put("runner_config.max_grad_norm", 0.0, path)
        elif lookup(path) is None and lookup(path.rpartition(".")[0] or path) is not None \
                and _match(path, K.GRAPH_NOT_APPLIED) is None:
            _set(t.out, path, value)                                 # unknown: the schema check names it
        elif _match(path, K.GRAPH_NOT_APPLIED) is not None:
            t.skip(path, _match(path, K.GRAPH_NOT_APPLIED))
        elif "." in path and lookup(path.split(".")[0]) is not None:
            t.errors.append(unknown(path, value, GRAPH))             # under a schema section: name the leaf
        else:
            _set(t.out, path, value)                                 # unknown section: the schema check names it
    # keys the file spells its own way name the setting even when empty (errors about a missing path)
    for section in ("train_dataset", "eval_dataset"):
        if isinstance(_get(raw, f"{section}.data_loader", None), dict):
            t.report.origin.setdefault(f"{section}.dataset_dir", f"{section}.data_loader.dataset_dir")
            t.report.origin.setdefault(f"{section}.type", f"{section}.data_loader.type")
    if isinstance(_get(raw, "processor.tokenizer", None), dict) and "train_dataset.tokenizer_file" not in t.given:
        t.report.origin.setdefault("train_dataset.tokenizer_file", "processor.tokenizer.vocab_file")
    betas = [_get(raw, "optimizer.beta1", None), _get(raw, "optimizer.beta2", None)]
    if any(b is not None for b in betas):
        given = _get(raw, "optimizer.betas", None)
        pair = [b if b is not None else d for b, d in zip(betas, given or [0.9, 0.95])]
        if given is not None and list(given) != pair:
            t.errors.append(f"optimizer.beta1/beta2 = {betas}: conflict with optimizer.betas = {given}; give one")
        else:
            t.given.pop("optimizer.betas", None)
            t.put("optimizer.betas", pair, "optimizer.beta1" if betas[0] is not None else "optimizer.beta2")
    # model: arch, model_config (own keys, aliases, checked, not applied)
    model = raw.get("model")
    if isinstance(model, dict):
        for key in model:
            if key == "pretrained_model_dir":                        # MindFormers copies the top-level key here
                if model[key] not in _EMPTY:
                    t.put("pretrained_model_dir", model[key], "model.pretrained_model_dir")
            elif key not in ("arch", "model_config"):
                _set(t.out, f"model.{key}", model[key])              # the schema check names it
        arch = model.get("arch")
        if isinstance(arch, dict):
            for key, value in arch.items():
                if key == "type":
                    t.put("model.arch.type", value, "model.arch.type")
                elif key == K.AUTO_REGISTER:
                    t.auto_register_arch = ("model.arch.auto_register", value)
                else:
                    _set(t.out, f"model.arch.{key}", value)
        elif arch is not None:
            _set(t.out, "model.arch", arch)
        if isinstance(model_cfg, dict):
            t.model(model_cfg, "model.model_config.", mc_own)
            _auto_register(t)
            if "model.arch.type" not in t.given:
                _resolve_arch(t, model_cfg.get("architectures"), model_cfg.get("model_type"),
                              "model.model_config.architectures", "model.model_config.model_type")
        elif model_cfg is not None:
            _set(t.out, "model.model_config", model_cfg)
    elif model is not None:
        t.out["model"] = model
    _callbacks(t, raw.get("callbacks", _MISSING))
    if getattr(t, "do_eval", False):
        _add_callback(t, "EvalCallBack", {"eval_interval": raw.get("eval_step_interval", 100)}, "do_eval")
    # MindFormers' pipeline_interleave is a bool, model_config.pp_interleave_num the count
    flag = getattr(t, "vpp_flag", None)
    if flag is not None:
        given = t.given.get("parallel.pipeline_config.pipeline_interleave")
        count = given[1] if flag and given else 1
        _set(t.out, "parallel.pipeline_config.pipeline_interleave", count)
        t.report.origin["parallel.pipeline_config.pipeline_interleave"] = "parallel.pipeline_config.pipeline_interleave"
        if isinstance(count, int) and count > 1 and \
                _get(t.out, "parallel.pipeline_config.pipeline_scheduler", "1f1b") == "1f1b":
            _set(t.out, "parallel.pipeline_config.pipeline_scheduler", "interleaved")
    return t.out, t


def _resolve_arch(t: _Translation, architectures: Any, model_type: Any, arch_key: str, type_key: str) -> None:
    """``model.arch.type`` from HF-style ``architectures``/``model_type`` (the model registry's precedence)."""
    from ..models import registered_models, resolve_model
    archs = [architectures] if isinstance(architectures, str) else list(architectures or [])
    if not archs and model_type in _EMPTY:
        return
    try:
        spec = resolve_model(None, archs, None if model_type in _EMPTY else model_type)
    except ValueError:
        key, value = (arch_key, architectures) if archs else (type_key, model_type)
        t.errors.append(f"{key} = {value!r}: not a registered model (registered: {registered_models()}; user "
                        "models register with @register_model and load with --register_path)")
        return
    t.put("model.arch.type", spec.name, arch_key if archs else type_key)


def _import_class(t: _Translation, user: str, ref: Any) -> Optional[type]:
    """MindFormers' ``auto_register: module.Class``: import ``module`` (from ``--register_path``, which is on
    sys.path once imported, or ``$REGISTER_PATH``) and return the class; None after naming the problem."""
    import importlib
    import os
    import sys
    module, _, name = ref.rpartition(".") if isinstance(ref, str) else ("", "", "")
    if not module or not name:
        t.errors.append(f"{user} = {ref!r}: must be 'module.Class' (e.g. deepseek3.DeepseekV3ForCausalLM), the module "
                        "in the --register_path directory")
        return None
    env = os.environ.get("REGISTER_PATH")
    if env and os.path.isdir(env) and os.path.realpath(env) not in map(os.path.realpath, sys.path):
        sys.path.insert(0, os.path.realpath(env))
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as e:   # noqa: BLE001 -- any failure of user code becomes one named error
        t.errors.append(f"{user} = {ref!r}: importing it failed ({type(e).__name__}: {e}); give --register_path DIR "
                        "with the directory that holds the module")
        return None
    if not isinstance(cls, type):
        t.errors.append(f"{user} = {ref!r}: not a class")
        return None
    return cls


def _auto_register(t: _Translation) -> None:
    """``model.arch.auto_register`` / ``model.model_config.auto_register`` as MindFormers does it: import the
    named module, then use the class -- as registered by its own ``@register_model``, or registered here with
    the config class ``model_config.auto_register`` names (a class with ``from_model_config``)."""
    arch, conf = t.auto_register_arch, t.auto_register_config
    if arch is None and conf is None:
        return
    from ..models import register_model, spec_of_model
    config_class = None
    if conf is not None:
        config_class = _import_class(t, *conf)
        if config_class is None:
            return
        if arch is None:
            t.skip(conf[0], "the config class is imported; the model class (model.arch) decides the model")
            return
    cls = _import_class(t, *arch)
    if cls is None:
        return
    try:
        spec = spec_of_model(cls)
    except ValueError:
        if config_class is None or not callable(getattr(config_class, "from_model_config", None)):
            t.errors.append(f"{arch[0]} = {arch[1]!r}: {cls.__name__} is not a registered model; register it in its "
                            "module (@register_model(config_class=...)) or give model.model_config.auto_register: "
                            "module.ConfigClass (a config class with from_model_config)")
            return
        try:
            register_model(cls.__name__, config_class=config_class)(cls)
        except ValueError as e:
            t.errors.append(f"{arch[0]} = {arch[1]!r}: {e}")
            return
        spec = spec_of_model(cls)
    if conf is not None and spec.config_class is not config_class:
        t.errors.append(f"{conf[0]} = {conf[1]!r}: {spec.name} is registered with the config class "
                        f"{spec.config_class.__name__}, not {config_class.__name__}")
        return
    t.put("model.arch.type", spec.name, arch[0])


# ------------------------------------------------------------------------------------------------ pretrained_model_dir
# model_config keys that decide the weights' shapes: a YAML value other than config.json's cannot load its weights
WEIGHT_SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "n_kv_heads", "head_dim",
                     "vocab_size", "num_experts", "moe_intermediate_size", "qk_layernorm", "add_qkv_bias",
                     "tie_word_embeddings", "decoder_sparse_step", "mlp_only_layers")


def _schema_name(name: str) -> str:
    return K.MODEL_ALIASES.get(name, name)


def merge_pretrained_model_dir(raw: Dict[str, Any], dialect: str) -> Tuple[List[str], Dict[str, str]]:
    """MindFormers' ``pretrained_model_dir``: the folder's config.json read into the YAML's model section (its
    keys are the defaults; every key the YAML gives, in any spelling, wins), and its ``architectures`` naming
    the model when the YAML names none. In place on ``raw`` (the file's own dialect, before translation).
    Returns ``(errors, origins)``: errors name the key, the file and the key of config.json (a folder that
    cannot be read, an architecture no family reads, a YAML model class of another family, or a YAML size that
    contradicts config.json while load_checkpoint loads that folder's weights); origins: schema key ->
    ``config.json path: key`` for the keys it set (errors about them name the file)."""
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    key, folder = "pretrained_model_dir", raw.get("pretrained_model_dir")
    if folder in _EMPTY and dialect == GRAPH and model.get("pretrained_model_dir") not in _EMPTY:
        key, folder = "model.pretrained_model_dir", model.get("pretrained_model_dir")
    if folder in _EMPTY:
        return [], {}
    if not isinstance(folder, str):
        return [f"{key} = {folder!r}: must be the path of a Hugging Face model folder"], {}
    from ..models.hf.config import HFConfigError, read_hf_config_keys
    try:
        spec, ours, hf_key_of, source = read_hf_config_keys(folder)
    except HFConfigError as e:
        message = str(e)
        message = message[len(repr(folder)) + 2:] if message.startswith(repr(folder) + ": ") else message
        return [f"{key} = {folder!r}: {message}"], {}
    if raw.get("model") is None:
        raw["model"] = {}
    if not isinstance(raw["model"], dict):
        return [f"model = {raw.get('model')!r}: must be a mapping"], {}
    if dialect == GRAPH:
        if not isinstance(raw["model"].get("model_config"), dict):
            raw["model"]["model_config"] = {}
        section, prefix = raw["model"]["model_config"], "model.model_config."
    else:
        section, prefix = raw["model"], "model."
    errors: List[str] = []
    # the model the YAML names (if any) must be the folder's family
    named = _yaml_model(raw, section, dialect)
    if named is not None:
        user, value, other = named
        if other is None or other.name != spec.name:
            errors.append(f"{user} = {value!r}: contradicts {source}: architectures = {spec.name!r} (the folder's "
                          f"config and weights are a {spec.name}); remove {user} or give another pretrained_model_dir")
            return errors, {}
    else:
        section["architectures"] = [spec.name]
    weights = _loads_folder(raw, dialect, folder)
    given = {_schema_name(k): k for k in section}
    origins: Dict[str, str] = {}
    for name, value in ours.items():
        if name in given:
            yaml_value = section[given[name]]
            if yaml_value in _EMPTY:
                section.pop(given[name])              # an empty key: the folder's value
            else:
                read = (not yaml_value) if given[name] in K.NEGATED else yaml_value     # untie_... = not tie_...
                if weights and name in WEIGHT_SHAPE_KEYS and read != value and name in hf_key_of:
                    errors.append(f"{prefix}{given[name]} = {yaml_value!r}: contradicts {source}: {hf_key_of[name]} = "
                                  f"{value!r}, and load_checkpoint loads that folder's weights (they would not fit); "
                                  f"remove {prefix}{given[name]} or load another checkpoint")
                continue
        section[name] = value
        origins[f"model.model_config.{name}"] = f"{source}: {hf_key_of.get(name, name + ' (family default)')}"
    return errors, origins


def _yaml_model(raw: Dict[str, Any], section: Dict[str, Any], dialect: str):
    """``(user key, value, ModelSpec or None)`` of the model class the YAML names, or None when it names none."""
    from ..models import get_model_spec, resolve_model
    arch = raw["model"].get("arch") if dialect == GRAPH else None
    if isinstance(arch, dict) and arch.get("type") not in _EMPTY:
        try:
            return "model.arch.type", arch["type"], get_model_spec(arch["type"])
        except ValueError:
            return None           # translation names the unknown class
    if isinstance(arch, dict) and arch.get(K.AUTO_REGISTER) not in _EMPTY:
        return None               # resolved (and checked) when translated
    archs, model_type = section.get("architectures"), section.get("model_type")
    archs = [archs] if isinstance(archs, str) else list(archs or []) if isinstance(archs, list) else []
    if not archs and model_type in _EMPTY:
        return None
    prefix = "model.model_config." if dialect == GRAPH else "model."
    user, value = (prefix + "architectures", section.get("architectures")) if archs else (prefix + "model_type", model_type)
    try:
        return user, value, resolve_model(None, archs, None if model_type in _EMPTY else model_type)
    except ValueError:
        return user, value, None


def _loads_folder(raw: Dict[str, Any], dialect: str, folder: str) -> bool:
    """Whether load_checkpoint (PyNative: checkpoint.load_path) names the folder itself."""
    import os
    path = raw.get("load_checkpoint") if dialect == GRAPH else _get(raw, "checkpoint.load_path", None)
    if dialect != GRAPH and path in _EMPTY:
        path = raw.get("load_checkpoint")
    return isinstance(path, str) and path not in _EMPTY and \
        os.path.realpath(path) == os.path.realpath(folder)


def _callbacks(t: _Translation, value: Any) -> None:
    if value is _MISSING:
        return
    if not isinstance(value, list):
        t.out["callbacks"] = value
        return
    own = set(lookup("callbacks").fields) if lookup("callbacks") is not None else set()
    kept = []
    for i, cb in enumerate(value):
        if not isinstance(cb, dict):
            kept.append(cb)
            continue
        kind = cb.get("type")
        if kind in K.CALLBACKS_NOT_APPLIED:
            t.skip(f"callbacks[{i}].type={kind}".replace("=", ": "), K.CALLBACKS_NOT_APPLIED[kind])
            continue
        entry = {}
        for k, v in cb.items():
            reason = _match(f"callbacks.{k}", K.GRAPH_NOT_APPLIED if t.report.dialect == GRAPH
                            else {**K.GRAPH_NOT_APPLIED, **K.PYNATIVE_NOT_APPLIED})
            if k in own:
                entry[k] = v
                if reason is not None:
                    t.skip(f"callbacks[{i}].{k}", reason)
            elif reason is not None:
                t.skip(f"callbacks[{i}].{k}", reason)
            else:
                entry[k] = v                                          # the schema check names it
        kept.append(entry)
    t.out["callbacks"] = kept


def _add_callback(t: _Translation, kind: str, fields: Dict[str, Any], user: str) -> None:
    cbs = t.out.get("callbacks")
    if cbs is None:
        cbs = t.out["callbacks"] = [{"type": "MFLossMonitor"}]
    if isinstance(cbs, list) and not any(isinstance(c, dict) and c.get("type") == kind for c in cbs):
        cbs.append({"type": kind, **fields})
        t.report.origin.setdefault("callbacks", "callbacks")


# ------------------------------------------------------------------------------------------------ PyNative
def _pynative(raw: Dict[str, Any], worker_num: int) -> Tuple[Dict[str, Any], _Translation]:
    t = _Translation(PYNATIVE)
    for path, value in _walk({k: v for k, v in raw.items() if k not in ("model", "callbacks", "eval_dataset",
                                                                         "lora_config")}):
        if path in K.PYNATIVE_ALIASES:
            target = K.PYNATIVE_ALIASES[path]
            if path == "train_dataset.dataloader.type":
                t.loader_type(path, value, target)
            elif path == "parallelism.data_parallel_shard" and value == -1:
                continue                                           # derived below
            elif path == "monitor.health_checkpoint.global_norm_skip_threshold" and lookup(target) is None:
                t.skip(path, K.MONITOR)
            elif value in _EMPTY and path in ("checkpoint.load_path", "train_dataset.dataloader.dataset_dir",
                                              "train_dataset.dataloader.dataset_files"):
                continue
            else:
                t.put(target, value, path)
        elif path in ("training.global_batch_size", "checkpoint.enable_save", "checkpoint.save_interleaved_steps",
                      "checkpoint.save_max", "checkpoint.prefix", "checkpoint.async_save",
                      "parallelism.data_parallel_shard_strategy"):
            continue                                               # below
        elif path == "training.rampup_batch_size":
            if value is not None:
                t.errors.append(f"training.rampup_batch_size = {value!r}: batch-size ramp-up is not implemented; "
                                "set it to null")
        elif path in ("train_dataset.dataloader.column_names", "train_dataset.input_columns"):
            t.columns(path, value)                                 # input_columns: HFDataLoader's batch keys
        elif re.sub(r"\[\d+\]$", "", path) == "recompute.full_recompute_layer":
            continue                                               # below, with the pipeline size
        elif path == "recompute.mode":
            mode = str(value).lower()
            if mode in ("none", "full", "select"):
                t.put("recompute_config.recompute" if mode != "select" else "recompute_config.select_recompute",
                      mode != "none", path)
            else:
                t.errors.append(f"recompute.mode = {value!r}: must be one of ['None', 'full', 'select']")
        elif _match(path, K.PYNATIVE_NOT_APPLIED) is not None:
            t.skip(path, _match(path, K.PYNATIVE_NOT_APPLIED))
        else:
            t.errors.append(unknown(path, value, PYNATIVE))
    if raw.get("lora_config") is not None:      # LoRA (PEFT's spelling): the graph dialect's pet_config
        t.lora(raw["lora_config"], "lora_config")
    if "eval_dataset" in raw:
        t.out["eval_dataset"] = raw["eval_dataset"]                # our own section, schema-checked
    model = raw.get("model")
    if isinstance(model, dict):
        names = ("model_type", "architectures")
        t.model({k: v for k, v in model.items() if k not in names}, "model.",
                [k for k in lookup("model.model_config").fields if k != "type"])
        _auto_register(t)
        _resolve_arch(t, model.get("architectures"), model.get("model_type"), "model.architectures",
                      "model.model_type")
    elif model is not None:
        t.errors.append(f"model = {model!r}: must be a mapping (model_type, architectures, sizes)")
    _callbacks(t, raw.get("callbacks", _MISSING))
    # checkpoint saving: CheckpointConfig.enable_save (default True) every save_interleaved_steps (1000)
    ck = raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}
    if ck.get("enable_save", True) is True and "checkpoint" in raw:
        fields = {"save_checkpoint_steps": ck.get("save_interleaved_steps", 1000),
                  "keep_checkpoint_max": ck.get("save_max", 5)}
        if ck.get("prefix"):
            fields["prefix"] = ck["prefix"]
        if "async_save" in ck:
            fields["async_save"] = ck["async_save"]
        _add_callback(t, "CheckpointMonitor", fields, "checkpoint.enable_save")
        for ours, theirs in (("save_checkpoint_steps", "save_interleaved_steps"), ("keep_checkpoint_max", "save_max")):
            t.report.origin.setdefault(f"callbacks.{ours}", f"checkpoint.{theirs}")
    elif ck.get("enable_save", True) not in (True, False):
        t.errors.append(f"checkpoint.enable_save = {ck['enable_save']!r}: must be True or False")
    else:
        for k in ("save_interleaved_steps", "save_max", "prefix", "async_save"):
            if k in ck:
                t.skip(f"checkpoint.{k}", K.CHECKPOINT_IO)
    # MindFormers' PyNative trainer upgrades 1f1b to interleaved_1f1b when there are virtual stages
    vpp = _get(t.out, "parallel.pipeline_config.pipeline_interleave", 1)
    if isinstance(vpp, int) and vpp > 1 and _get(t.out, "parallel.pipeline_config.pipeline_scheduler", "1f1b") == "1f1b":
        _set(t.out, "parallel.pipeline_config.pipeline_scheduler", "interleaved")
    # sizes: data parallel derived (-1), steps with epochs enough to reach them, global batch -> accumulation
    pc = t.out.get("parallel_config", {})
    tp, cp, pp = (int(pc.get(k, 1)) if isinstance(pc.get(k, 1), int) else 1
                  for k in ("model_parallel", "context_parallel", "pipeline_stage"))
    if "data_parallel" not in pc:
        dp = max(1, worker_num // max(1, tp * cp * pp))
        _set(t.out, "parallel_config.data_parallel", dp)
    dp = _get(t.out, "parallel_config.data_parallel")
    _fsdp_strategy(t, _get(raw, "parallelism.data_parallel_shard_strategy", _MISSING), dp)
    _full_recompute_layers(t, raw.get("recompute"), pp)
    if "use_parallel" not in t.given:
        _set(t.out, "use_parallel", worker_num > 1)
    if "runner_config.max_steps" in t.given:
        _set(t.out, "runner_config.epochs", 1_000_000)           # training.steps decides
    else:
        _set(t.out, "runner_config.max_steps", 1000)              # TrainingConfig.steps default
        _set(t.out, "runner_config.epochs", 1_000_000)
    gbs = _get(raw, "training.global_batch_size", _MISSING)
    lbs = _get(t.out, "runner_config.batch_size", 1)
    if gbs is not _MISSING:
        if not isinstance(gbs, int) or isinstance(gbs, bool) or gbs < 1:
            t.errors.append(f"training.global_batch_size = {gbs!r}: must be an int >= 1")
        elif isinstance(lbs, int) and isinstance(dp, int) and lbs > 0 and dp > 0:
            if gbs % (lbs * dp):
                t.errors.append(f"training.global_batch_size = {gbs}: must be a multiple of training.local_batch_size "
                                f"{lbs} x data parallel {dp} (= {lbs * dp}; the rest are accumulation steps or "
                                "pipeline micro-batches)")
            else:
                k = gbs // (lbs * dp)
                _set(t.out, "parallel_config.micro_batch_num" if pp > 1 else
                     "runner_config.gradient_accumulation_steps", k)
                t.report.origin["parallel_config.micro_batch_num" if pp > 1 else
                                "runner_config.gradient_accumulation_steps"] = "training.global_batch_size"
    return t.out, t


def _full_recompute_layers(t: _Translation, rec: Any, pp: int) -> None:
    """``recompute.full_recompute_layer`` (layer indices and ``"a-b"`` ranges, with ``mode: full``): without a
    pipeline, a prefix ``0..n-1`` is ``recompute_config.recompute: [n]`` (the first n layers; n at or past the
    layer count = all of them). Other selections are named: our full recompute takes per-stage layer counts."""
    user = "recompute.full_recompute_layer"
    if not isinstance(rec, dict) or rec.get("full_recompute_layer") in _EMPTY + ([],):
        return
    value = rec["full_recompute_layer"]
    if str(rec.get("mode", "none")).lower() != "full":
        t.skip(user, "read with recompute.mode full only")
        return
    layers = set()
    for item in value if isinstance(value, list) else [value]:
        text = str(item)
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
        if isinstance(item, bool) or m is None or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            t.errors.append(f"{user} = {value!r}: give layer indices and 'a-b' ranges (e.g. ['0-3'])")
            return
        layers.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    n = len(layers)
    if pp != 1 or layers != set(range(n)):
        t.errors.append(f"{user} = {value!r}: only the first layers (a range starting at 0) without a pipeline "
                        f"(parallelism.pipeline_parallel 1) are read here; full recompute takes per-stage layer "
                        "counts (graph mode's recompute_config.recompute list)")
        return
    _set(t.out, "recompute_config.recompute", [n])
    t.report.origin["recompute_config.recompute"] = user


def _fsdp_strategy(t: _Translation, value: Any, dp: Any) -> None:
    """``parallelism.data_parallel_shard_strategy``: MindFormers' PyNative data parallelism is fully sharded
    (FSDP over ``data_parallel_shard``); ``optim_grads_params`` (its default, the value its files carry) shards
    optimizer state, gradients and weights: our hsdp level3 over all of data parallel, every weight (threshold
    0: FSDP has no size floor). At data parallel 1 there is nothing to shard (listed as not applied)."""
    user = "parallelism.data_parallel_shard_strategy"
    if value is _MISSING:
        return
    if value != "optim_grads_params":
        t.errors.append(f"{user} = {value!r}: only 'optim_grads_params' (optimizer state, gradients and weights "
                        "sharded over data parallel: hsdp level3) is read here; for another split use "
                        "optim_grads_params or remove the key (plain data parallel)")
    elif isinstance(dp, int) and dp > 1:
        t.put("parallel.enable_parallel_optimizer", True, user)
        t.put("hsdp.optimizer_level", "level3", user)
        t.put("hsdp.threshold", 0, user)
    else:
        t.skip(user, K.GRAPH_PARALLEL)


# ------------------------------------------------------------------------------------------------ entry points
def translate(raw: Dict[str, Any], worker_num: int = 1, dialect: Optional[str] = None
              ) -> Tuple[Dict[str, Any], Report, List[str]]:
    """``(schema-dialect mapping, report, errors)`` for a raw YAML mapping of either dialect."""
    dialect = dialect or detect(raw)
    out, t = _pynative(raw, worker_num) if dialect == PYNATIVE else _graph(raw)
    return out, t.report, t.errors


def override_known(path: str, dialect: str) -> bool:
    """Whether an override ``--path`` names a key of ``dialect`` (the schema's, or the table's)."""
    if dialect == GRAPH and lookup(path) is not None:
        return True
    stars = {k: True for k in (K.GRAPH_SPECIAL if dialect == GRAPH else K.PYNATIVE_SPECIAL) if k.endswith(".*")}
    return path in known_paths(dialect) or any(p.startswith(path + ".") for p in known_paths(dialect)) or \
        _match(path, K.GRAPH_NOT_APPLIED if dialect == GRAPH else K.PYNATIVE_NOT_APPLIED) is not None or \
        _match(path, stars) is not None


def table_markdown() -> str:
    """docs/config.md's dialect tables, generated from :mod:`.mindformers_keys`."""
    out = ["### Graph-mode keys read into the schema's keys (applied)", "",
           "| key in the file | read as |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in K.GRAPH_ALIASES.items()]
    out += [f"| `model.model_config.{k}` | `model.model_config.{v}`{' (negated)' if k in K.NEGATED else ''} |"
            for k, v in K.MODEL_ALIASES.items()]
    out += ["", "### DeepSeek-V3 `moe_config` keys (graph mode, applied; see docs/moe.md)", "",
            "| key in the file | read as |", "|---|---|"]
    out += [f"| `moe_config.{k}` | `model.model_config.{v}`"
            + {"use_gating_sigmoid": " (`sigmoid` / `softmax`)", "expert_num": " (<= 1: a dense model)",
               "aux_loss_factors": " (one factor; with `use_gmm: True`, `aux_loss_factor` beside it is not read, "
                                   "as MindFormers' MoEV3)"
               }.get(k, "") + " |" for k, v in K.MOE_CONFIG_KEYS.items()]
    out += ["", "### YaRN in MindFormers' flat keys (both dialects, applied)", "",
            "With `position_embedding_type: yarn` these keys make one `model.model_config.rope_scaling` mapping (type "
            f"yarn; `original_max_position_embeddings` {K.YARN_ORIGINAL_DEFAULT} when not given, as mcore's); without "
            "it they are refused by name.", "", "| key in the file | `rope_scaling` key |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in K.YARN_FLAT.items()]
    out += ["", "### PyNative TrainConfig keys (applied)", "", "| key in the file | read as |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in K.PYNATIVE_ALIASES.items()]
    out += ["| `training.global_batch_size` | `runner_config.gradient_accumulation_steps` (pipeline: "
            "`parallel_config.micro_batch_num`) = global / (local_batch_size x data parallel) |",
            "| `parallelism.data_parallel_shard: -1` | data parallel = workers / (tp x cp x pp) |",
            "| `recompute.full_recompute_layer: ['0-3']` (`mode: full`, no pipeline) | "
            "`recompute_config.recompute: [4]` (the first 4 layers) |",
            "| `parallelism.data_parallel_shard_strategy: optim_grads_params` | `parallel.enable_parallel_optimizer` "
            "+ `hsdp.optimizer_level: level3`, `hsdp.threshold: 0` when data parallel > 1 (MindFormers' FSDP: "
            "optimizer state, gradients and weights sharded, whatever their size) |",
            "| `checkpoint.enable_save`, `save_interleaved_steps`, `save_max`, `prefix` | a `CheckpointMonitor` |",
            "| `recompute.mode` | `none` / `full` (`recompute_config.recompute`) / `select` |",
            "| `model.model_type`, `model.architectures` | `model.arch.type` (the model registry) |",
            "| `model.<name>` | as `model.model_config.<name>` (its own names and the aliases above) |"]
    out += ["", "### Values read as the schema's", "", "| key | value in the file | read as |", "|---|---|---|"]
    out += [f"| `{k}` | `{a}` | `{b}` |" for k, m in K.VALUE_ALIASES.items() for a, b in m.items()]
    out += ["", "### Model keys accepted only with one value (else a named error)", "",
            "| key | accepted | otherwise |", "|---|---|---|"]
    out += [f"| `{k}` | {', '.join(repr(v) for v in ok)} | {why} |" for k, (ok, why) in K.MODEL_CHECKED.items()]
    out += [f"| `{K.PRE_SOFTMAX}` | True (our router's order), False (read as `norm_topk_prob: True`: the same "
            "weights) | must be True or False |"]
    out += [f"| `moe_config.{k}` | {', '.join(repr(v) for v in ok)} | {why} |"
            for k, (ok, why) in K.MOE_CONFIG_CHECKED.items()]
    out += [f"| `data_loader.type` / `dataloader.type` | MindDataset, BlendedMegatronDatasetDataLoader, HFDataLoader | {', '.join(K.LOADERS_NOT_IMPLEMENTED)}: "
            "not implemented |"]
    out += ["", "### Known to MindFormers, not applied here (accepted, listed at start-up)", "",
            "| key | why |", "|---|---|"]
    model_na = {f"model.model_config.{k}": v for k, v in K.MODEL_NOT_APPLIED.items()}
    rows: Dict[str, List[str]] = {}
    moe_na = {f"moe_config.{k}": v for k, v in K.MOE_CONFIG_NOT_APPLIED.items()}
    for table, dialect in ((K.GRAPH_NOT_APPLIED, "graph"), (model_na, "graph"), (moe_na, "graph"),
                           (K.PYNATIVE_NOT_APPLIED, "PyNative"),
                           ({f"callbacks: type {k}": v for k, v in K.CALLBACKS_NOT_APPLIED.items()}, "graph")):
        for k, reason in table.items():
            rows.setdefault(f"{reason} ({dialect})", []).append(f"`{k}`")
    out += [f"| {', '.join(keys)} | {reason} |" for reason, keys in rows.items()]
    return "\n".join(out) + "\n"
