"""A family's Hugging Face state-dict adapter: a table of names, HF <-> ours, on NumPy dicts.

Each row is a :class:`NameRule`: our parameter name and the Hugging Face name, as patterns whose
``{i}`` (any ``{name}``) stands for an integer -- the global, 0-based layer index in
``decoder.layers.{i}.…`` <-> ``model.layers.{i}.…`` -- and whether the tensor is transposed
(Hugging Face's ``nn.Linear`` stores ``(out, in)``, ours ``(in, out)``). A
:class:`StateDictAdapter` holds a family's rows; the converter (``research/llama/convert_weight.py``),
the loader and exporter and the tests read the same table.

A row maps one tensor of ours to one Hugging Face tensor. Stacked or fused tensors (experts stored as
one ``(E, in, out)`` tensor, fused qkv) fit as other :class:`Rule` kinds: a rule says which of our
names it matches, which Hugging Face names feed one of ours (``hf_sources``) and how to build ours from
them and back. Pure NumPy; no MindSpore.
"""
from __future__ import annotations

import re
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Rule", "NameRule", "StateDictAdapter", "layer_rules"]

_FIELD = re.compile(r"\{(\w+)\}")


@lru_cache(maxsize=None)
def _compile(pattern: str) -> "re.Pattern":
    parts, last = [], 0
    for m in _FIELD.finditer(pattern):
        parts += [re.escape(pattern[last:m.start()]), f"(?P<{m.group(1)}>\\d+)"]
        last = m.end()
    return re.compile("".join(parts + [re.escape(pattern[last:])]))


class Rule:
    """One kind of row. ``match_ours(name)`` / ``match_hf(name)``: the integer fields of a name the
    rule covers (None when it does not); ``ours(fields)``: our name; ``hf_sources(fields)``: the
    Hugging Face names one of ours is built from; ``to_hf(fields, array)``: ``{hf name: array}``;
    ``from_hf(fields, arrays)``: ours from the arrays of ``hf_sources``, in that order."""

    def match_ours(self, name: str) -> Optional[Dict[str, int]]:
        raise NotImplementedError

    def match_hf(self, name: str) -> Optional[Dict[str, int]]:
        raise NotImplementedError

    def ours(self, fields: Mapping[str, int]) -> str:
        raise NotImplementedError

    def hf_sources(self, fields: Mapping[str, int]) -> List[str]:
        raise NotImplementedError

    def to_hf(self, fields: Mapping[str, int], array: np.ndarray) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def from_hf(self, fields: Mapping[str, int], arrays: Sequence[np.ndarray]) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class NameRule(Rule):
    """One tensor of ours is one Hugging Face tensor, transposed (2-D) or not."""
    ours_pattern: str
    hf_pattern: str
    transpose: bool = False

    def __post_init__(self):
        if set(_FIELD.findall(self.ours_pattern)) != set(_FIELD.findall(self.hf_pattern)):
            raise ValueError(f"NameRule: {self.ours_pattern!r} and {self.hf_pattern!r} must use the same fields")

    def match_ours(self, name):
        m = _compile(self.ours_pattern).fullmatch(name)
        return None if m is None else {k: int(v) for k, v in m.groupdict().items()}

    def match_hf(self, name):
        m = _compile(self.hf_pattern).fullmatch(name)
        return None if m is None else {k: int(v) for k, v in m.groupdict().items()}

    def ours(self, fields):
        return self.ours_pattern.format(**fields)

    def hf_sources(self, fields):
        return [self.hf_pattern.format(**fields)]

    def _flip(self, array):
        array = np.asarray(array)
        return np.ascontiguousarray(array.T if self.transpose else array)

    def to_hf(self, fields, array):
        return {self.hf_pattern.format(**fields): self._flip(array)}

    def from_hf(self, fields, arrays):
        return self._flip(arrays[0])


def layer_rules(ours_prefix: str, hf_prefix: str, table: Mapping[str, Tuple[str, bool]]) -> List[NameRule]:
    """Rows for ``{ours inside a layer: (hf inside a layer, transposed?)}`` under the two prefixes
    (e.g. ``"decoder.layers.{i}."`` and ``"model.layers.{i}."``)."""
    return [NameRule(ours_prefix + ours, hf_prefix + hf, transposed) for ours, (hf, transposed) in table.items()]


@dataclass(frozen=True)
class StateDictAdapter:
    """A family's table. ``fallbacks``: a Hugging Face name to read when another is absent (a tied
    checkpoint has no ``lm_head.weight``: read ``model.embed_tokens.weight``); ``ignored``: Hugging
    Face names (patterns) that are not weights of ours (e.g. rotary ``inv_freq`` buffers)."""
    rules: Tuple[Rule, ...]
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    ignored: Tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "ignored", tuple(self.ignored))

    def _ours(self, name: str) -> Tuple[Rule, Dict[str, int]]:
        for rule in self.rules:
            fields = rule.match_ours(name)
            if fields is not None:
                return rule, fields
        raise KeyError(f"no Hugging Face name for parameter {name!r} in this family's table")

    def hf_names(self, name: str) -> List[str]:
        """The Hugging Face names our parameter ``name`` is stored under."""
        rule, fields = self._ours(name)
        return rule.hf_sources(fields)

    def to_hf(self, state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Our state dict (global layer numbers) under Hugging Face names and shapes."""
        out: Dict[str, np.ndarray] = {}
        for name, array in state.items():
            rule, fields = self._ours(name)
            out.update(rule.to_hf(fields, array))
        return out

    def _source(self, hf_state: Mapping[str, np.ndarray], hf: str, ours: str) -> np.ndarray:
        if hf in hf_state:
            return hf_state[hf]
        if self.fallbacks.get(hf) in hf_state:
            return hf_state[self.fallbacks[hf]]
        raise KeyError(f"{hf!r} (for {ours!r}) is not in the checkpoint")

    def from_hf(self, hf_state: Mapping[str, np.ndarray], names: Optional[Iterable[str]] = None
                ) -> Dict[str, np.ndarray]:
        """Our state dict from a Hugging Face one: exactly ``names`` (KeyError naming a missing
        Hugging Face tensor), or everything ``hf_state`` holds (KeyError naming a tensor no row covers)."""
        if names is None:
            names = []
            ignored = [_compile(p) for p in self.ignored]
            for hf in hf_state:
                if any(p.fullmatch(hf) for p in ignored):
                    continue
                for rule in self.rules:
                    fields = rule.match_hf(hf)
                    if fields is not None:
                        names.append(rule.ours(fields))
                        break
                else:
                    raise KeyError(f"Hugging Face tensor {hf!r}: no row of this family's table names it")
            names = list(dict.fromkeys(names))
        out = {}
        for name in names:
            rule, fields = self._ours(name)
            out[name] = rule.from_hf(fields, [self._source(hf_state, hf, name) for hf in rule.hf_sources(fields)])
        return out
