"""``GenerationConfig``: what to generate, with Hugging Face's keys and defaults.

Read from a model folder's ``generation_config.json`` and overridden by the YAML's generation keys
(MindFormers ``model.model_config``: ``do_sample``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``, ``max_decode_length``, ``max_new_tokens``, ...) and the command line. Unknown keys of
generation_config.json are ignored (it carries many that do not change the tokens); bad values raise
``ValueError`` naming the key, the value and what is valid, before anything runs.

Defaults are transformers' ``GenerationConfig`` defaults: greedy; with ``do_sample`` temperature 1.0,
``top_k`` 50, ``top_p`` 1.0; repetition penalty 1.0; ``max_length`` 20 when neither limit is given.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

# MindFormers' model_config spellings -> ours
ALIASES = {"max_decode_length": "max_length"}
LIMITS = ("max_new_tokens", "max_length")


@dataclass
class GenerationConfig:
    max_new_tokens: Optional[int] = None
    max_length: Optional[int] = None      # prompt + new tokens (transformers); max_new_tokens wins when both set
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos_token_id: List[int] = field(default_factory=list)
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.eos_token_id = [] if self.eos_token_id is None else [int(e) for e in self.eos_token_id]
        self.validate()

    @classmethod
    def from_dict(cls, *sources: Optional[Mapping[str, Any]]) -> "GenerationConfig":
        """Later sources override earlier ones (generation_config.json, then YAML, then flags); keys that are
        not generation keys are ignored, None values do not override. A source that sets a length limit
        (``max_new_tokens`` or ``max_length``) replaces the earlier sources' limits (max_new_tokens would
        otherwise win over a later max_length)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: Dict[str, Any] = {}
        for source in sources:
            given = {ALIASES.get(k, k): v for k, v in (source or {}).items() if v is not None}
            if any(k in given for k in LIMITS):
                for k in LIMITS:
                    values.pop(k, None)
            values.update({k: v for k, v in given.items() if k in names})
        return cls(**values)

    def replace(self, **changes) -> "GenerationConfig":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def validate(self) -> None:
        bad = value_problems(self)
        if bad:
            raise ValueError("generation config: " + "; ".join(f"{k}={v!r}: {rule}" for k, v, rule in bad))

    def new_tokens_for(self, prompt_length: int) -> int:
        """How many tokens to generate after a (padded) prompt of ``prompt_length`` tokens."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if self.max_length is not None:
            if self.max_length <= prompt_length:
                raise ValueError(f"max_length={self.max_length} (prompt + new tokens) is not above the prompt "
                                 f"length {prompt_length}: raise max_length or set max_new_tokens")
            return self.max_length - prompt_length
        return max(1, 20 - prompt_length)


def as_id_list(value: Union[None, int, Sequence[int]]) -> List[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def value_problems(config) -> List[Tuple[str, Any, str]]:
    """``(key, value, what is valid)`` for each bad value of ``config`` (a GenerationConfig or any object with
    its attributes): what ``validate`` raises, and what the YAML check names by its own keys."""
    bad = []
    if not _number(config.top_p) or not 0.0 < float(config.top_p) <= 1.0:
        bad.append(("top_p", config.top_p, "must be in (0, 1] (1.0 keeps every token)"))
    if isinstance(config.top_k, bool) or not isinstance(config.top_k, int) or config.top_k < 0:
        bad.append(("top_k", config.top_k, "must be an integer >= 0 (0 keeps every token)"))
    if not _number(config.temperature) or not float(config.temperature) > 0.0:
        bad.append(("temperature", config.temperature, "must be > 0 (use do_sample=False for greedy)"))
    if not _number(config.repetition_penalty) or not float(config.repetition_penalty) > 0.0:
        bad.append(("repetition_penalty", config.repetition_penalty, "must be > 0 (1.0 = no penalty)"))
    for key in LIMITS:
        value = getattr(config, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            bad.append((key, value, "must be a positive integer"))
    value = config.min_new_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        bad.append(("min_new_tokens", value, "must be an integer >= 0"))
    if not isinstance(config.do_sample, bool):
        bad.append(("do_sample", config.do_sample, "must be true or false"))
    return bad


def defaults() -> Dict[str, Any]:
    """The default value of every generation key."""
    return {f.name: (f.default_factory() if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(GenerationConfig)}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
