"""LoRA settings as MindFormers and PEFT users write them, checked, as one ``LoraSettings``.

Graph dialect (``model.model_config.pet_config``, MindFormers' ``mindformers.pet.pet_config.LoraConfig``):
``pet_type: lora``, ``lora_rank`` (8), ``lora_alpha`` (16), ``lora_dropout`` (0.01), ``target_modules`` (a
regex over Cell names, e.g. ``'.*wq|.*wk|.*wv|.*wo'``), ``exclude_layers``, ``lora_a_init`` / ``lora_b_init``
('normal' / 'zero'), ``param_init_type`` / ``compute_dtype``, ``freeze_include`` / ``freeze_exclude``.
PyNative dialect (``lora_config``, PEFT's spelling): ``r``/``rank``, ``lora_alpha``/``alpha``,
``lora_dropout``/``dropout``, ``target_modules`` (a regex string or a list of module names / regexes).
Module names may be ours (``linear_q``), Hugging Face's (``q_proj``) or MindFormers' Llama names (``wq``).
Pure logic: no MindSpore import.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence, Tuple

ALIASES = {"lora_rank": "rank", "r": "rank", "rank": "rank", "lora_alpha": "alpha", "alpha": "alpha",
           "lora_dropout": "dropout", "dropout": "dropout", "target_modules": "target_modules",
           "exclude_layers": "exclude_modules", "exclude_modules": "exclude_modules",
           "lora_a_init": "a_init", "lora_b_init": "b_init", "init_lora_weights": "init_lora_weights"}
# accepted, no effect here (named in docs/finetune.md)
ACCEPTED = ("pet_type", "type", "param_init_type", "compute_dtype", "freeze_include", "freeze_exclude", "bias",
            "task_type", "inference_mode", "modules_to_save", "fan_in_fan_out", "peft_type", "use_rslora",
            "use_dora", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern")
DEFAULTS = {"rank": 8, "alpha": 16, "dropout": 0.0}


class LoraConfigError(ValueError):
    """A LoRA setting that cannot work: the message names the key, the value and what is valid."""


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Tuple[str, ...] = ()      # regexes (a list entry without regex characters: a module name)
    exclude_modules: Tuple[str, ...] = ()
    source: str = "lora_config"               # the key the user wrote (for messages)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules), "exclude_modules": list(self.exclude_modules)}


def _patterns(key: str, value: Any, where: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) and p for p in items):
        raise LoraConfigError(f"{where}.{key} = {value!r}: give a regex string or a list of module names / regexes")
    for p in items:
        try:
            re.compile(p)
        except re.error as e:
            raise LoraConfigError(f"{where}.{key} = {p!r}: not a regular expression ({e})") from None
    return tuple(items)


def parse_lora(raw: Optional[Mapping], where: str = "lora_config") -> Optional[LoraSettings]:
    """``LoraSettings`` of a ``pet_config`` / ``lora_config`` mapping (None: LoRA off)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise LoraConfigError(f"{where} = {raw!r}: give a mapping (lora_rank, lora_alpha, lora_dropout, "
                              "target_modules)")
    kind = raw.get("pet_type", raw.get("peft_type", "lora"))
    if str(kind).lower() != "lora":
        raise LoraConfigError(f"{where}.pet_type = {kind!r}: only 'lora' is implemented")
    values = dict(DEFAULTS)
    for key, value in raw.items():
        if key in ALIASES:
            values[ALIASES[key]] = value
        elif key not in ACCEPTED:
            raise LoraConfigError(f"{where}.{key} = {value!r}: unknown LoRA key; known: "
                                  f"{sorted(set(ALIASES) | set(ACCEPTED))}")
    for key in ("a_init", "b_init", "init_lora_weights"):
        v = values.pop(key, None)
        if key == "a_init" and v not in (None, "normal"):
            raise LoraConfigError(f"{where}.lora_a_init = {v!r}: only 'normal' is implemented")
        if key == "b_init" and v not in (None, "zero", "zeros"):
            raise LoraConfigError(f"{where}.lora_b_init = {v!r}: only 'zero' (the model starts as its base) "
                                  "is implemented")
        if key == "init_lora_weights" and v not in (None, True):
            raise LoraConfigError(f"{where}.init_lora_weights = {v!r}: only true (B = 0) is implemented")
    rank, alpha, dropout = values["rank"], values["alpha"], values["dropout"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraConfigError(f"{where}.lora_rank = {rank!r}: must be an integer >= 1")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise LoraConfigError(f"{where}.lora_alpha = {alpha!r}: must be a number > 0 (scaling = alpha / rank)")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise LoraConfigError(f"{where}.lora_dropout = {dropout!r}: must be in [0, 1)")
    targets = _patterns("target_modules", values.get("target_modules"), where)
    if not targets:
        raise LoraConfigError(f"{where}.target_modules = {values.get('target_modules')!r}: name the layers to adapt, "
                              "e.g. '.*q_proj|.*v_proj' or [q_proj, k_proj, v_proj, o_proj] (our linear_q..., "
                              "MindFormers' wq... and Hugging Face's q_proj... names all match)")
    return LoraSettings(int(rank), float(alpha), float(dropout), targets,
                        _patterns("exclude_modules", values.get("exclude_modules"), where), where)


# a linear's other names: Hugging Face's and MindFormers' (Llama) module names for ours
HF_MODULE = {"self_attention.linear_q": "self_attn.q_proj", "self_attention.linear_k": "self_attn.k_proj",
             "self_attention.linear_v": "self_attn.v_proj", "self_attention.linear_proj": "self_attn.o_proj",
             "mlp.linear_fc1_gate": "mlp.gate_proj", "mlp.linear_fc1_up": "mlp.up_proj",
             "mlp.linear_fc2": "mlp.down_proj"}
MF_MODULE = {"self_attention.linear_q": "attention.wq", "self_attention.linear_k": "attention.wk",
             "self_attention.linear_v": "attention.wv", "self_attention.linear_proj": "attention.wo",
             "mlp.linear_fc1_gate": "feed_forward.w1", "mlp.linear_fc1_up": "feed_forward.w3",
             "mlp.linear_fc2": "feed_forward.w2"}
# the routed experts' weights (ours: one (E, in, out) tensor each) by their other names: Hugging Face's per-expert
# modules (``mlp.experts.{e}.gate_proj``, named here without the expert index), transformers 5's fused parameters
# (``mlp.experts.gate_up_proj`` / ``down_proj``) and MindFormers' (Megatron) expert linears (``linear_fc1`` / ``linear_fc2``)
EXPERT_MODULE = {"mlp.experts.w_gate": ("mlp.experts.gate_proj", "mlp.experts.gate_up_proj", "mlp.experts.linear_fc1"),
                 "mlp.experts.w_up": ("mlp.experts.up_proj", "mlp.experts.gate_up_proj", "mlp.experts.linear_fc1"),
                 "mlp.experts.w_down": ("mlp.experts.down_proj", "mlp.experts.linear_fc2")}
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def module_names(ours: str) -> List[str]:
    """Every name a Cell path is known by: ours, Hugging Face's, MindFormers'."""
    names = [ours]
    m = _LAYER.match(ours)
    if m:
        i, rest = m.groups()
        if rest in HF_MODULE:
            names.append(f"model.layers.{i}.{HF_MODULE[rest]}")
        if rest in MF_MODULE:
            names.append(f"model.layers.{i}.{MF_MODULE[rest]}")
        for other in EXPERT_MODULE.get(rest, ()):
            names.append(f"{'decoder' if 'linear_fc' in other else 'model'}.layers.{i}.{other}")
    return names


def _hit(pattern: str, names: Sequence[str]) -> bool:
    plain = re.fullmatch(r"[\w.]+", pattern) is not None
    for n in names:
        if re.fullmatch(pattern, n) or (plain and (n == pattern or n.endswith("." + pattern))):
            return True
    return False


def matches(settings: LoraSettings, cell_name: str) -> bool:
    names = module_names(cell_name)
    return any(_hit(p, names) for p in settings.target_modules) and \
        not any(_hit(p, names) for p in settings.exclude_modules)
