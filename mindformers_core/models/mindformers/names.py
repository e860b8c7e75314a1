"""MindFormers' checkpoint names <-> ours: the tables, which scheme a checkpoint uses, and the adapter for a model.

Read from MindFormers 2.1.0's source (``mindformers/models/llama/convert_weight.py`` ``name_replace``, the legacy
``llama_transformer.py`` / ``llama_layer.py``, the mcore models' ``weight_mapping`` / ``weight_converters`` in
``models/{qwen3,qwen3_moe,deepseek3}/utils.py``, ``checkpoint/converter/convert_op.py`` and
``parallel_core/utils/model_mixin.py``); every MindFormers projection is stored ``(out, in)`` like Hugging Face's,
ours ``(in, out)``.

Two schemes:

- ``legacy`` (``use_legacy: True``: MindFormers' Llama and its research Qwen2 = Llama with q/k/v biases):
  ``model.tok_embeddings.embedding_weight``, ``model.layers.{i}.attention.{wq,wk,wv,wo}``,
  ``feed_forward.{w1,w3,w2}`` (gate, up, down), ``attention_norm``, ``ffn_norm``, ``model.norm_out``,
  ``lm_head``; with ``qkv_concat`` the fused ``attention.w_qkv`` (grouped by kv head: each group's q heads, then
  its k and v, as the model's ``reshape(..., n_kv_head, (n_rep + 2) * head_dim)`` reads it) and
  ``feed_forward.w_gate_hidden`` (gate and up rows interleaved, as its ``reshape(..., hidden_dim, 2)`` reads it).
- ``mcore`` (MindFormers 2.x's Qwen3, Qwen3-MoE, DeepSeek-V3 training models): ``embedding.word_embeddings``,
  ``decoder.layers.{i}.self_attention.linear_qkv`` (grouped by kv head by default;
  ``use_contiguous_weight_layout_attention: True``: [all q; all k; all v]), ``linear_proj``, ``q_layernorm`` /
  ``k_layernorm``, ``mlp.linear_fc1`` (gate/up row-interleaved by default; ``use_interleaved_weight_layout_mlp:
  False``: [gate; up]), ``linear_fc2``, ``mlp.router.weight`` / ``router.expert_bias``, the routed experts stacked
  as ``mlp.experts.weight1`` ``(E*h, 2*f)`` (each expert's gate then up) and ``weight2`` ``(E*f, h)``, the shared
  experts ``mlp.shared_experts.linear_fc1`` / ``linear_fc2``; DeepSeek-V3's multi-latent attention as
  ``mla_qkv_concat: True`` (the default) stores it: ``linear_qkv`` = [q_down (or the whole q projection without
  q_lora_rank); kv_down], ``linear_qb``, ``linear_kvb``, ``q_layernorm``, ``k_layernorm`` (the kv latent's norm),
  or with ``mla_qkv_concat: False`` Megatron's names (``linear_q_down_proj``, ..., ``kv_layernorm``);
  ``decoder.final_layernorm``, ``output_layer``.

Which layout a fused tensor has is not in the file: it is the model config's (the keys above, MindFormers' own
defaults when absent). Optimizer state and counters a MindFormers checkpoint also holds (``adam_m.*``,
``adam_v.*``, ``global_step``, the router's ``fi_accu`` ...) are not weights: ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..state_dict import NameRule, Rule, StateDictAdapter, layer_rules
from .rules import ExpertsRule, FusedRule

LEGACY, MCORE = "legacy", "mcore"
SCHEMES = (LEGACY, MCORE)
# the scheme a family is written in by default (MindFormers 2.1.0: Llama is legacy only, Qwen3 / Qwen3-MoE /
# DeepSeek-V3 mcore only; its Qwen2 is the research legacy Llama with biases)
DEFAULT_SCHEME = {"llama": LEGACY, "qwen2": LEGACY, "qwen3": MCORE, "qwen3_moe": MCORE, "deepseek_v3": MCORE}
# model_config keys choosing the fused layouts (MindFormers' defaults)
LAYOUT_KEYS = {"use_contiguous_weight_layout_attention": False, "use_interleaved_weight_layout_mlp": True,
               "mla_qkv_concat": True, "qkv_concat": False}

# the earlier mcore models' single q/k/v layout key (mindspore-lab/mindformers before 2.1.0: default True, contiguous)
OLD_QKV_KEY = "use_contiguous_weight_layout"

# names in a MindFormers checkpoint that are not model weights (optimizer state, counters, loss scale)
IGNORED = re.compile(r"^(adam_m|adam_v|accu_grads|moment1|moment2|exp_avg|exp_avg_sq)\.|"
                     r"^(global_step|learning_rate|scale_sense|epoch_num|step_num|loss_scale|current_iterator_step|"
                     r"last_overflow_iterator_step|beta1_power|beta2_power)$|"
                     r"\.(fi_accu|expert_load|tokens_per_expert|inv_freq)$")

# ------------------------------------------------------------------------------------------------ legacy
LEGACY_TOP = {   # ours -> (MindFormers, transposed?)
    "embedding.word_embeddings.weight": ("model.tok_embeddings.embedding_weight", False),
    "decoder.final_layernorm.weight": ("model.norm_out.weight", False),
    "output_layer.weight": ("lm_head.weight", True),
}
LEGACY_LAYER = {
    "input_layernorm.weight": ("attention_norm.weight", False),
    "pre_mlp_layernorm.weight": ("ffn_norm.weight", False),
    "self_attention.linear_proj.weight": ("attention.wo.weight", True),
    "mlp.linear_fc2.weight": ("feed_forward.w2.weight", True),
}
LEGACY_QKV_SPLIT = {
    "self_attention.linear_q.weight": ("attention.wq.weight", True),
    "self_attention.linear_k.weight": ("attention.wk.weight", True),
    "self_attention.linear_v.weight": ("attention.wv.weight", True),
    "self_attention.linear_q.bias": ("attention.wq.bias", False),
    "self_attention.linear_k.bias": ("attention.wk.bias", False),
    "self_attention.linear_v.bias": ("attention.wv.bias", False),
}
LEGACY_FFN_SPLIT = {
    "mlp.linear_fc1_gate.weight": ("feed_forward.w1.weight", True),
    "mlp.linear_fc1_up.weight": ("feed_forward.w3.weight", True),
}
LEGACY_QKV_FUSED, LEGACY_FFN_FUSED = "attention.w_qkv", "feed_forward.w_gate_hidden.weight"

# ------------------------------------------------------------------------------------------------ mcore
MCORE_TOP = {
    "embedding.word_embeddings.weight": ("embedding.word_embeddings.weight", False),
    "decoder.final_layernorm.weight": ("decoder.final_layernorm.weight", False),
    "output_layer.weight": ("output_layer.weight", True),
}
MCORE_LAYER = {
    "input_layernorm.weight": ("input_layernorm.weight", False),
    "pre_mlp_layernorm.weight": ("pre_mlp_layernorm.weight", False),
    "self_attention.linear_proj.weight": ("self_attention.linear_proj.weight", True),
    "self_attention.q_layernorm.weight": ("self_attention.q_layernorm.weight", False),
    "self_attention.k_layernorm.weight": ("self_attention.k_layernorm.weight", False),
    "mlp.linear_fc2.weight": ("mlp.linear_fc2.weight", True),
    "mlp.router.weight": ("mlp.router.weight", True),
    "mlp.router.expert_bias": ("mlp.router.expert_bias", False),
    "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_experts.linear_fc2.weight", True),
}
MCORE_MLA_CONCAT = {     # mla_qkv_concat True (MindFormers' default): ours -> (MindFormers, transposed?)
    "self_attention.linear_q_up_proj.weight": ("self_attention.linear_qb.weight", True),
    "self_attention.linear_kv_up_proj.weight": ("self_attention.linear_kvb.weight", True),
    "self_attention.q_layernorm.weight": ("self_attention.q_layernorm.weight", False),
    "self_attention.kv_layernorm.weight": ("self_attention.k_layernorm.weight", False),
}
MCORE_MLA_SPLIT = {      # mla_qkv_concat False: Megatron's names, as ours
    k: (k, not k.endswith("layernorm.weight")) for k in (
        "self_attention.linear_q_proj.weight", "self_attention.linear_q_down_proj.weight",
        "self_attention.linear_q_up_proj.weight", "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_up_proj.weight", "self_attention.q_layernorm.weight",
        "self_attention.kv_layernorm.weight")}
EXPERTS = {   # ours -> (MindFormers, part, parts)
    "mlp.experts.w_gate": ("mlp.experts.weight1", 0, 2),
    "mlp.experts.w_up": ("mlp.experts.weight1", 1, 2),
    "mlp.experts.w_down": ("mlp.experts.weight2", 0, 1),
}


@dataclass(frozen=True)
class FusedLayout:
    """The fused layouts a model config gives (MindFormers' keys; see the module doc)."""
    contiguous_qkv: bool = False
    interleaved_mlp: bool = True
    mla_qkv_concat: bool = True

    @classmethod
    def of(cls, model_config: Optional[Mapping]) -> "FusedLayout":
        """From MindFormers' keys; ``use_contiguous_weight_layout`` (the single key of the earlier mcore models,
        default True there: contiguous q/k/v) is read when the 2.1.0 key is absent."""
        mc = dict(model_config or {})
        get = lambda k: bool(mc[k]) if mc.get(k) is not None else LAYOUT_KEYS[k]   # noqa: E731
        contiguous = get("use_contiguous_weight_layout_attention")
        if mc.get("use_contiguous_weight_layout_attention") is None and mc.get(OLD_QKV_KEY) is not None:
            contiguous = bool(mc[OLD_QKV_KEY])
        return cls(contiguous, get("use_interleaved_weight_layout_mlp"), get("mla_qkv_concat"))


@dataclass(frozen=True)
class Heads:
    """What the fused attention layouts need from the model config."""
    num_heads: int
    num_groups: int
    head_dim: int
    q_width: int = 0          # MLA: rows of linear_qkv before kv_down (q_lora_rank, or heads x q head dim)
    kv_width: int = 0         # MLA: kv_down's rows (kv_lora_rank + the rotary head dim)

    @classmethod
    def of(cls, config) -> "Heads":
        heads = int(config.num_attention_heads)
        groups = int(getattr(config, "num_query_groups", None) or heads)
        head_dim = int(getattr(config, "kv_channels", None) or config.hidden_size // heads)
        q_width = kv_width = 0
        if getattr(config, "multi_latent_attention", False):
            q_lora = getattr(config, "q_lora_rank", None)
            q_width = int(q_lora) if q_lora else heads * (int(config.qk_head_dim) + int(config.qk_pos_emb_head_dim))
            kv_width = int(config.kv_lora_rank) + int(config.qk_pos_emb_head_dim)
        return cls(heads, groups, head_dim, q_width, kv_width)


class MFAdapter(StateDictAdapter):
    """A :class:`StateDictAdapter` over MindFormers names (``hf`` in its methods = the MindFormers side): it also
    writes fused and stacked tensors (``to_hf``), and ignores optimizer state and counters."""

    scheme: str = MCORE

    def _ours(self, name: str):
        try:
            return super()._ours(name)
        except KeyError:
            raise KeyError(f"no MindFormers name for parameter {name!r} in the {self.scheme} table") from None

    def ours_of_hf(self, hf: str) -> Optional[str]:
        if IGNORED.search(hf):
            return None
        return super().ours_of_hf(hf)

    def to_hf(self, state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        out: Dict[str, np.ndarray] = {}
        filled: Dict[str, List[str]] = {}
        for name, array in state.items():
            rule, fields = self._ours(name)
            array = np.asarray(array)
            if hasattr(rule, "place"):
                (target, shape), = rule.hf_shapes(fields, array.shape).items()
                if target not in out:
                    out[target] = np.zeros(shape, array.dtype)
                elif tuple(out[target].shape) != tuple(shape):
                    raise ValueError(f"{name} of shape {array.shape} does not fit {target} {out[target].shape}")
                rule.place(fields, array, out[target])
                filled.setdefault(target, []).append(rule.part)
            else:
                out.update(rule.to_hf(fields, array))
        for target, parts in filled.items():      # every part of a fused tensor must be there (once)
            rules = [r for r in self.rules if hasattr(r, "place") and r.match_hf(target) is not None]
            missing = [r.ours(r.match_hf(target)) for r in rules if r.part not in parts]
            if missing or len(parts) != len(set(parts)):
                raise KeyError(f"MindFormers tensor {target!r} fuses "
                               f"{[r.ours(r.match_hf(target)) for r in rules]}; the state gives parts {sorted(parts)}"
                               f"{f', not {missing}' if missing else ''}")
        return out


def _named(rules: Iterable[Rule], scheme: str, fallbacks: Mapping[str, str]) -> MFAdapter:
    adapter = MFAdapter(list(rules), fallbacks=dict(fallbacks))
    object.__setattr__(adapter, "scheme", scheme)
    return adapter


def _qkv(prefix_ours: str, prefix_mf: str, fused: str, heads: Heads, contiguous: bool, bias: bool) -> List[Rule]:
    rep = heads.num_heads // heads.num_groups
    if contiguous:
        sizes = (heads.num_heads * heads.head_dim, heads.num_groups * heads.head_dim,
                 heads.num_groups * heads.head_dim)
    else:
        sizes = (rep * heads.head_dim, heads.head_dim, heads.head_dim)
    rules: List[Rule] = []
    for part, q in enumerate(("linear_q", "linear_k", "linear_v")):
        rules.append(FusedRule(f"{prefix_ours}self_attention.{q}.weight", f"{prefix_mf}{fused}.weight", part, sizes, 3))
        if bias:
            rules.append(FusedRule(f"{prefix_ours}self_attention.{q}.bias", f"{prefix_mf}{fused}.bias", part, sizes, 3,
                                   transpose=False))
    return rules


def _fc1(ours: str, mf: str, interleaved: bool) -> List[Rule]:
    sizes = (1, 1) if interleaved else None
    return [FusedRule(f"{ours}_gate.weight", mf, 0, sizes, 2), FusedRule(f"{ours}_up.weight", mf, 1, sizes, 2)]


def legacy_adapter(heads: Heads, qkv_fused: bool = False, ffn_fused: bool = False) -> MFAdapter:
    """The legacy Llama / Qwen2 table (split or fused q/k/v and gate/up)."""
    L, M = "decoder.layers.{i}.", "model.layers.{i}."
    rules: List[Rule] = [NameRule(o, m, t) for o, (m, t) in LEGACY_TOP.items()]
    rules += layer_rules(L, M, LEGACY_LAYER)
    rules += _qkv(L, M, LEGACY_QKV_FUSED, heads, False, True) if qkv_fused else layer_rules(L, M, LEGACY_QKV_SPLIT)
    rules += _fc1(L + "mlp.linear_fc1", M + LEGACY_FFN_FUSED, True) if ffn_fused else layer_rules(L, M, LEGACY_FFN_SPLIT)
    return _named(rules, LEGACY, {"lm_head.weight": "model.tok_embeddings.embedding_weight"})


def mcore_adapter(heads: Heads, layout: FusedLayout = FusedLayout()) -> MFAdapter:
    """The mcore table: dense or MoE layers, GQA attention (with q/k norms) or multi-latent attention."""
    L = "decoder.layers.{i}."
    rules: List[Rule] = [NameRule(o, m, t) for o, (m, t) in MCORE_TOP.items()]
    rules += layer_rules(L, L, MCORE_LAYER)
    rules += _fc1(L + "mlp.linear_fc1", L + "mlp.linear_fc1.weight", layout.interleaved_mlp)
    rules += _fc1(L + "mlp.shared_experts.linear_fc1", L + "mlp.shared_experts.linear_fc1.weight",
                  layout.interleaved_mlp)
    rules += [ExpertsRule(L + o, L + m, part, n) for o, (m, part, n) in EXPERTS.items()]
    if heads.q_width:                         # multi-latent attention
        if layout.mla_qkv_concat:
            rules += layer_rules(L, L, MCORE_MLA_CONCAT)
            sizes, qkv = (heads.q_width, heads.kv_width), L + "self_attention.linear_qkv.weight"
            for ours in ("self_attention.linear_q_down_proj.weight", "self_attention.linear_q_proj.weight"):
                rules.append(FusedRule(L + ours, qkv, 0, sizes, 2))
            rules.append(FusedRule(L + "self_attention.linear_kv_down_proj.weight", qkv, 1, sizes, 2))
        else:
            rules += layer_rules(L, L, MCORE_MLA_SPLIT)
    else:
        rules += _qkv(L, L, "self_attention.linear_qkv", heads, layout.contiguous_qkv, True)
    return _named(rules, MCORE, {"output_layer.weight": "embedding.word_embeddings.weight"})


def detect_scheme(names: Iterable[str]) -> Optional[str]:
    """``"legacy"``, ``"mcore"`` or None (no MindFormers scheme: e.g. our own checkpoint's names, whose
    ``linear_q`` / ``linear_fc1_gate`` MindFormers fuses)."""
    names = list(names)
    legacy = mcore = False
    for n in names:
        if n == "model.tok_embeddings.embedding_weight" or (n.startswith("model.layers.") and
                                                            (".attention." in n or ".feed_forward." in n)):
            legacy = True
        if n.startswith("decoder.layers.") and any(k in n for k in (
                ".self_attention.linear_qkv.", ".mlp.linear_fc1.weight", ".experts.weight1", ".experts.weight2",
                ".self_attention.linear_qb.", ".self_attention.linear_kvb.", ".shared_experts.linear_fc1.weight")):
            mcore = True
    if legacy and not mcore:
        return LEGACY
    if mcore and not legacy:
        return MCORE
    return None


def scheme_problem(path: str, names: Sequence[str]) -> str:
    shown = ", ".join(sorted(n for n in names if not IGNORED.search(n))[:4])
    return (f"{path}: its tensor names ({shown}, ...) follow no MindFormers scheme: the legacy one names "
            "model.tok_embeddings.embedding_weight and model.layers.N.attention.wq.weight, the mcore one "
            "decoder.layers.N.self_attention.linear_qkv.weight and mlp.linear_fc1.weight")


def adapter_for(model_type: Optional[str], config, names: Optional[Iterable[str]] = None,
                scheme: Optional[str] = None, model_config: Optional[Mapping] = None) -> MFAdapter:
    """The MindFormers table for a model of ``config`` (a TransformerConfig): the scheme the checkpoint's
    ``names`` use (or ``scheme``, else the family's default), its fused tensors as the names show (legacy
    ``w_qkv`` / ``w_gate_hidden``) and the layouts ``model_config`` gives (MindFormers' keys)."""
    names = list(names or [])
    if scheme is None:
        scheme = detect_scheme(names) if names else DEFAULT_SCHEME.get(model_type or "", MCORE)
    if scheme not in SCHEMES:
        raise ValueError(f"MindFormers scheme {scheme!r}: one of {SCHEMES}")
    heads = Heads.of(config)
    if scheme == LEGACY:
        if heads.q_width:
            raise ValueError(f"{model_type}: multi-latent attention has no legacy MindFormers names (use mcore)")
        qkv = any(f".{LEGACY_QKV_FUSED}." in n for n in names)
        ffn = any(n.endswith(LEGACY_FFN_FUSED) for n in names)
        if not names:
            qkv = ffn = bool((model_config or {}).get("qkv_concat", False))
        return legacy_adapter(heads, qkv, ffn)
    layout = FusedLayout.of(model_config)
    if heads.q_width and names:
        concat = any(".self_attention.linear_kvb." in n for n in names)
        layout = FusedLayout(layout.contiguous_qkv, layout.interleaved_mlp, concat)
    return mcore_adapter(heads, layout)


__all__ = ["LEGACY", "MCORE", "SCHEMES", "DEFAULT_SCHEME", "LAYOUT_KEYS", "FusedLayout", "Heads", "MFAdapter",
           "legacy_adapter", "mcore_adapter", "detect_scheme", "scheme_problem", "adapter_for", "IGNORED"]
