"""A Hugging Face model folder's ``config.json`` read into a registered family and its ``model_config``, and
back (``write_hf_config``, for the exporter).

``read_hf_config(folder) -> (ModelSpec, model_config, generation_config)``: ``config.json`` (JSON only;
nothing in the folder is imported, ``auto_map`` / remote code included) names the family by
``architectures`` (else ``model_type``); the family's :class:`HFConfigMapping` (``ModelSpec.hf_config``)
turns its keys into MindFormers ``model.model_config`` keys -- the trainer schema's names
(``num_layers``, ``num_heads``, ``n_kv_heads``, ``head_dim``, ``rope_theta``, ``num_experts``, ...), the
same a YAML gives, so a YAML's keys can override them one by one. Both spellings that published models
carry are read: ``transformers`` 4.x (``rope_theta``, ``num_experts``, ``torch_dtype``) and 5.x
(``rope_parameters.rope_theta``, ``num_local_experts``, ``dtype``). A key that asks for something not
implemented (a non-null ``rope_scaling``, sliding-window attention, biases on the output projection) is an
:class:`HFConfigError` naming the file and the key; keys that change nothing here (token ids,
``use_cache``, ``torch_dtype`` -- the stored weights' dtype; training uses ``compute_dtype`` and
``param_init_dtype``, as in MindFormers) are read and left out. Pure Python (no MindSpore).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["HFConfigError", "HFConfigMapping", "read_hf_config", "read_hf_config_keys", "hf_to_model_config", "write_hf_config",
           "resolve_hf_architecture", "hf_architectures", "COMMON_KEYS", "MOE_KEYS", "NOT_USED"]

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"

# Hugging Face key -> MindFormers model_config key (same value). Both transformers spellings.
COMMON_KEYS: Dict[str, str] = {
    "num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
    "num_attention_heads": "num_heads", "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim",
    "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta", "hidden_act": "hidden_act",
    "tie_word_embeddings": "tie_word_embeddings",
}
MOE_KEYS: Dict[str, str] = {
    "num_experts": "num_experts", "num_local_experts": "num_experts",          # 4.x / 5.x
    "num_experts_per_tok": "num_experts_per_tok", "moe_intermediate_size": "moe_intermediate_size",
    "norm_topk_prob": "norm_topk_prob", "router_aux_loss_coef": "moe_aux_loss_coeff",
    "decoder_sparse_step": "decoder_sparse_step", "mlp_only_layers": "mlp_only_layers",
}
# Keys read and not used: ids, caches, the stored dtype, bookkeeping (MindFormers ignores them too)
NOT_USED = ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
            "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "output_router_logits",
            "max_window_layers", "sliding_window", "auto_map", "_name_or_path", "return_dict", "is_decoder",
            "tie_encoder_decoder", "id2label", "label2id", "quantization_config")
# key -> (values that are fine, what is not implemented otherwise)
CHECKED: Dict[str, Tuple[tuple, str]] = {
    "rope_scaling": ((None,), "a scaled rotary embedding (YaRN, linear, dynamic, llama3) is not implemented; only "
                              "rope_scaling: null"),
    "use_sliding_window": ((False, None), "sliding-window attention is not implemented"),
    "attention_dropout": ((0, 0.0, None), "attention dropout is not implemented for Hugging Face models here; it "
                                          "must be 0.0"),
    "mlp_bias": ((False, None), "biases on the MLP projections are not implemented"),
    "pretraining_tp": ((1, None), "pretraining_tp > 1 (a sliced-matmul approximation) is not implemented"),
}
_POSITIVE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "n_kv_heads", "head_dim", "vocab_size",
             "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "decoder_sparse_step")
_SIZES = ("num_layers", "hidden_size", "num_heads", "vocab_size")      # must be in config.json


class HFConfigError(ValueError):
    """A config.json that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class HFConfigMapping:
    """A family's config.json mapping. ``architectures``: the Hugging Face class names it reads (the first is
    written); ``model_type``: config.json's ``model_type``; ``defaults``: model_config keys the family sets
    when config.json is silent (``qk_layernorm`` for Qwen3, ``add_qkv_bias`` for Qwen2, MindFormers'
    ``seq_length``); ``moe``: the family reads the mixture-of-experts keys; ``attention_bias``: what
    config.json's ``attention_bias`` means -- ``"qkvo"`` (Llama, Qwen3: biases on q/k/v and the output
    projection, of which only false is implemented) or ``None`` (Qwen2: biases on q/k/v always, no such key)."""
    architectures: Tuple[str, ...]
    model_type: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    moe: bool = False
    attention_bias: Optional[str] = "qkvo"

    def read(self, hf: Mapping[str, Any], source: str = CONFIG) -> Dict[str, Any]:
        return hf_to_model_config(hf, self, source)

    def write(self, config) -> Dict[str, Any]:
        return _write(config, self)


def _fail(source: str, key: str, value: Any, why: str):
    raise HFConfigError(f"{source}: {key} = {value!r}: {why}")


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def hf_to_model_config(hf: Mapping[str, Any], mapping: HFConfigMapping, source: str = CONFIG,
                       keys_out: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """config.json's keys (both transformers spellings) as MindFormers ``model_config`` keys; ``keys_out``
    (optional) receives our key -> the config.json key it came from."""
    out: Dict[str, Any] = dict(mapping.defaults)
    given: Dict[str, str] = {}                       # our key -> the config.json key that set it

    def put(ours: str, value: Any, key: str):
        if ours in given and out[ours] != value:
            _fail(source, key, value, f"disagrees with {given[ours]} = {out[ours]!r} (the same setting)")
        given[ours] = key
        out[ours] = value

    table = dict(COMMON_KEYS, **(MOE_KEYS if mapping.moe else {}))
    for key, value in hf.items():
        if key in table:
            if value is None and key not in ("head_dim",):
                continue
            if key == "head_dim" and value is None:
                continue
            put(table[key], value, key)
        elif key == "rope_parameters":               # transformers 5.x
            if value is None:
                continue
            if not isinstance(value, Mapping):
                _fail(source, key, value, "must be an object (rope_type, rope_theta)")
            kind = value.get("rope_type", value.get("type", "default"))
            if kind not in ("default", None):
                _fail(source, f"{key}.rope_type", kind, "a scaled rotary embedding (YaRN, linear, dynamic, llama3) "
                                                       "is not implemented; only the default rope")
            if value.get("rope_theta") is not None:
                put("rope_theta", value["rope_theta"], f"{key}.rope_theta")
        elif key == "attention_bias":
            if mapping.attention_bias == "qkvo" and value not in (False, None):
                _fail(source, key, value, f"biases on the q/k/v and output projections ({mapping.architectures[0]}) "
                                          "are not implemented (only Qwen2's q/k/v biases are); it must be false")
        elif key == "layer_types":                   # transformers 5.x: per-layer attention kind
            if not isinstance(value, list) or any(v != "full_attention" for v in value):
                _fail(source, key, value, "only full attention in every layer is implemented")
        elif key in CHECKED:
            ok, why = CHECKED[key]
            if not (_hashable(value) and value in ok):
                _fail(source, key, value, why)
        elif key in MOE_KEYS or key in ("shared_expert_intermediate_size", "n_routed_experts", "n_shared_experts"):
            _fail(source, key, value, f"a mixture-of-experts key, but {mapping.architectures[0]} is a dense model; "
                                      "is the architecture right?")
        # anything else (NOT_USED and keys no family here reads) changes nothing
    for ours in _SIZES:
        if ours not in out:
            hf_key = next(k for k, v in COMMON_KEYS.items() if v == ours)
            raise HFConfigError(f"{source}: {hf_key} is missing (the model's size cannot be known without it)")
    for ours in _POSITIVE:
        if ours in out and not _positive_int(out[ours]):
            _fail(source, given.get(ours, ours), out[ours], "must be an integer >= 1")
    if out.get("hidden_act", "silu") != "silu":
        _fail(source, "hidden_act", out["hidden_act"], "only silu (the gated SwiGLU MLP) is implemented for "
                                                        f"{mapping.architectures[0]}")
    for ours in ("rms_norm_eps", "rope_theta"):
        v = out.get(ours)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
            _fail(source, given.get(ours, ours), v, "must be a number > 0")
    if "rope_theta" in out:
        out["rope_theta"] = float(out["rope_theta"])
    if "tie_word_embeddings" in out and not isinstance(out["tie_word_embeddings"], bool):
        _fail(source, "tie_word_embeddings", out["tie_word_embeddings"], "must be true or false")
    if mapping.moe and out.get("num_experts") is None:
        raise HFConfigError(f"{source}: num_experts (transformers 5.x: num_local_experts) is missing: "
                            f"{mapping.architectures[0]} is a mixture-of-experts model")
    if keys_out is not None:
        keys_out.update(given)
    return out


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ registry
def hf_architectures() -> Dict[str, str]:
    """``{Hugging Face architecture: registered model name}`` of every family with a config mapping."""
    from ..registry import get_model_spec, registered_models
    out: Dict[str, str] = {}
    for name in registered_models():
        mapping = get_model_spec(name).hf_config
        for arch in getattr(mapping, "architectures", ()) or ():
            out.setdefault(arch, name)
    return out


def resolve_hf_architecture(hf: Mapping[str, Any], source: str = CONFIG):
    """The registered ``ModelSpec`` config.json names: the first of ``architectures`` a family reads, else
    its ``model_type``. ``HFConfigError`` naming the file, the key and what is registered."""
    from ..registry import get_model_spec, registered_models
    archs = hf.get("architectures")
    if isinstance(archs, str):
        archs = [archs]
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        _fail(source, "architectures", archs, "must be a list of class names")
    known = hf_architectures()
    for arch in archs or []:
        if arch in known:
            return get_model_spec(known[arch])
    model_type = hf.get("model_type")
    by_type = {get_model_spec(n).hf_config.model_type: n for n in registered_models()
               if get_model_spec(n).hf_config is not None}
    if not archs and model_type in by_type:
        return get_model_spec(by_type[model_type])
    remote = " (its auto_map names remote code, which is never imported here: a model folder is data)" \
        if hf.get("auto_map") else ""
    key, value = ("architectures", archs) if archs else ("model_type", model_type)
    raise HFConfigError(f"{source}: {key} = {value!r}: not a registered Hugging Face architecture{remote}; "
                        f"registered: {sorted(known)}. A new family registers with @register_model(..., "
                        "hf_config=HFConfigMapping(...)) and loads with --register_path")


def _read_json(path: str, required: bool) -> Optional[dict]:
    if not os.path.isfile(path):
        if required:
            raise HFConfigError(f"{path}: no such file (a Hugging Face model folder holds config.json; give the "
                                "folder that holds it)")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise HFConfigError(f"{path}: not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HFConfigError(f"{path}: cannot be read ({e})") from None
    if not isinstance(value, dict):
        raise HFConfigError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def read_hf_config(folder: str) -> Tuple[Any, Dict[str, Any], Optional[Dict[str, Any]]]:
    """``(ModelSpec, model_config, generation_config)`` of a Hugging Face model folder: the registered family
    config.json names, its keys as MindFormers ``model_config`` keys, and ``generation_config.json`` as a
    dict (None without one). Only JSON is read. ``HFConfigError`` naming the file and key."""
    spec, model_config, _, source = read_hf_config_keys(folder)
    generation = _read_json(os.path.join(os.path.dirname(source), GENERATION_CONFIG), required=False)
    return spec, model_config, generation


def read_hf_config_keys(folder: str) -> Tuple[Any, Dict[str, Any], Dict[str, str], str]:
    """``(ModelSpec, model_config, {our key: config.json key}, config.json path)`` (what the YAML merge names)."""
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        raise HFConfigError(f"{folder!r}: no such directory (pretrained_model_dir is a Hugging Face model folder "
                            "on this machine; a model name must be downloaded first: huggingface-cli download NAME "
                            "--local-dir DIR)")
    folder = os.path.abspath(os.fspath(folder))
    source = os.path.join(folder, CONFIG)
    hf = _read_json(source, required=True)
    spec = resolve_hf_architecture(hf, source)
    keys: Dict[str, str] = {}
    if isinstance(spec.hf_config, HFConfigMapping):
        model_config = hf_to_model_config(hf, spec.hf_config, source, keys)
    else:
        model_config = spec.hf_config.read(hf, source)
    return spec, model_config, keys, source


# ------------------------------------------------------------------------------------------------ writing
def write_hf_config(spec, model_config) -> Dict[str, Any]:
    """config.json (a dict) that ``transformers`` loads for the model ``spec`` builds with ``model_config``:
    a MindFormers ``model_config`` mapping (built through the family's config class) or the family's
    built ``TransformerConfig``. ``ValueError`` when the family has no Hugging Face config mapping."""
    mapping = getattr(spec, "hf_config", None)
    if mapping is None:
        raise ValueError(f"model {spec.name!r} has no Hugging Face config mapping (register it with "
                         "hf_config=HFConfigMapping(...))")
    positions = None
    if isinstance(model_config, Mapping):
        positions = model_config.get("max_position_embeddings")
        model_config = spec.config_class.from_model_config(dict(model_config))
    out = mapping.write(model_config)
    if positions:                      # the model's own limit (our rotary tables are built for seq_length)
        out["max_position_embeddings"] = positions
    return out


_DTYPE_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def _write(c, mapping: HFConfigMapping) -> Dict[str, Any]:
    """A built TransformerConfig ``c`` as config.json keys (transformers 4.x spelling, which 5.x also reads)."""
    if c.add_bias_linear:
        raise ValueError("write_hf_config: add_bias_linear (biases on every linear layer) has no "
                         f"{mapping.architectures[0]} config.json key")
    if mapping.attention_bias is None and not c.add_qkv_bias:
        raise ValueError(f"write_hf_config: {mapping.architectures[0]} always has q/k/v biases; this model has none")
    if mapping.attention_bias is not None and c.add_qkv_bias:
        raise ValueError(f"write_hf_config: q/k/v biases without an output-projection bias have no "
                         f"{mapping.architectures[0]} config.json key (Qwen2ForCausalLM has them)")
    if bool(getattr(c, "qk_layernorm", False)) != bool(mapping.defaults.get("qk_layernorm", False)):
        raise ValueError(f"write_hf_config: qk_layernorm={getattr(c, 'qk_layernorm', False)} is not what "
                         f"{mapping.architectures[0]} has")
    out: Dict[str, Any] = {
        "architectures": [mapping.architectures[0]], "model_type": mapping.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.ffn_hidden_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.query_groups, "hidden_act": "silu",
        "max_position_embeddings": c.max_positions, "rms_norm_eps": c.layernorm_epsilon,
        "rope_theta": float(c.rotary_base), "rope_scaling": None, "tie_word_embeddings": bool(c.tie_word_embeddings),
        "torch_dtype": _DTYPE_NAMES[c.params_dtype], "use_cache": True,
    }
    if c.kv_channels is not None:                # a head size given apart from hidden / heads (Qwen3 always)
        out["head_dim"] = c.kv_channels
    if mapping.attention_bias is not None:
        out["attention_bias"] = False
    if c.activation != "swiglu" or c.normalization != "RMSNorm":
        raise ValueError(f"write_hf_config: activation={c.activation!r}, normalization={c.normalization!r}: "
                         f"{mapping.architectures[0]} is SwiGLU with RMSNorm")
    if mapping.moe:
        if not c.is_moe:
            raise ValueError(f"write_hf_config: {mapping.architectures[0]} is a mixture-of-experts model; this "
                             "config has no experts")
        if c.moe_shared_expert_intermediate_size:
            raise ValueError(f"write_hf_config: shared experts have no {mapping.architectures[0]} config.json key")
        if c.moe_router_score_function != "softmax" or c.moe_router_num_groups or c.moe_router_enable_expert_bias \
                or c.moe_router_topk_scaling_factor != 1.0:
            raise ValueError(f"write_hf_config: {mapping.architectures[0]}'s router is a plain softmax top-k (no "
                             "sigmoid, groups, expert bias or scaling factor)")
        dense = [i for i in range(c.num_layers) if not c.is_moe_layer(i + 1)]
        out.update({"num_experts": c.num_moe_experts, "num_experts_per_tok": c.moe_router_topk,
                    "moe_intermediate_size": c.moe_ffn_hidden_size or c.ffn_hidden_size,
                    "norm_topk_prob": bool(c.moe_router_norm_topk_prob),
                    "router_aux_loss_coef": float(c.moe_aux_loss_coeff), "decoder_sparse_step": 1,
                    "mlp_only_layers": dense, "output_router_logits": False})
    elif c.is_moe:
        raise ValueError(f"write_hf_config: {mapping.architectures[0]} is a dense model; this config has experts")
    return out
