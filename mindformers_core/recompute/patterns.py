"""Choosing Cells by strings: name patterns, layer selections, MindFormers name translation.

A *qualified name* is a Cell's path as ``model.cells_and_names()`` gives it, e.g.
``decoder.layers.0.self_attention.core_attention``. A pattern matches a Cell when it matches the
whole qualified name or any dotted suffix of it (so ``mlp.act`` matches every layer's activation):

* **exact / glob** -- names made of ``[A-Za-z0-9_]`` parts, where ``*`` matches within one part
  (``layers.*.self_attention.core_attention``, ``linear_*``) and ``**`` any number of parts;
* **regular expression** -- anything else (``.*mlp.*act``, ``mlp\\.linear_fc1_(gate|up)``), or
  any pattern prefixed ``re:``; it must match a whole (suffix) name (``re.fullmatch``).
  ``glob:`` forces the glob reading.

A *layer selection* restricts a rule to transformer layers by their global 0-based index:
``None`` (anywhere, also outside layers), ``True``/``"all"`` (inside any layer), ``False``/``[]``
(nowhere), a range string ``"0-3,8-11"`` or a list of ints.

Everything here is plain Python: no MindSpore needed.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import FrozenSet, Iterable, List, Optional, Sequence, Union

from ..common.placement import format_layer_ranges, parse_layer_ranges

_GLOB_PART = re.compile(r"[A-Za-z0-9_*?]+")


class PatternError(ValueError):
    """A pattern or selection that cannot be used (bad syntax, or it matches no Cell)."""


@dataclass(frozen=True)
class Pattern:
    """One compiled pattern: ``text`` as given, ``kind`` ("glob" or "regex"), ``regex`` used."""
    text: str
    kind: str
    regex: "re.Pattern"

    def matches(self, name: str) -> bool:
        """True when the pattern matches ``name`` or one of its dotted suffixes."""
        parts = name.split(".")
        return any(self.regex.fullmatch(".".join(parts[i:])) for i in range(len(parts)))

    def __str__(self) -> str:
        return self.text


def _glob_to_regex(text: str) -> str:
    out = []
    for i, part in enumerate(text.split(".")):
        if part == "**":
            out.append(("" if i == 0 else r"\.") + r"(?:[^.]+(?:\.[^.]+)*)")
            continue
        piece = "".join(r"[^.]*" if c == "*" else r"[^.]" if c == "?" else re.escape(c) for c in part)
        out.append(("" if i == 0 else r"\.") + piece)
    return "".join(out)


def compile_pattern(text: str, where: str = "pattern") -> Pattern:
    """Compile ``text`` (see the module docstring for glob vs regex); ``where`` names it in errors."""
    if not isinstance(text, str) or not text.strip():
        raise PatternError(f"{where}={text!r}: a pattern must be a non-empty string such as "
                           "'layers.*.self_attention.core_attention' or '.*mlp.*act'")
    text = text.strip()
    body, kind = text, None
    if text.startswith("re:"):
        body, kind = text[3:], "regex"
    elif text.startswith("glob:"):
        body, kind = text[5:], "glob"
    elif all(_GLOB_PART.fullmatch(p) for p in text.split(".")):
        kind = "glob"
    else:
        kind = "regex"
    if kind == "glob":
        if not all(_GLOB_PART.fullmatch(p) for p in body.split(".")):
            raise PatternError(f"{where}={text!r}: a glob has dotted parts of letters, digits, '_', '*', '?' "
                               "(use 're:' for a regular expression)")
        regex = _glob_to_regex(body)
    else:
        regex = body
    try:
        return Pattern(text, kind, re.compile(regex))
    except re.error as err:
        raise PatternError(f"{where}={text!r} is not a valid regular expression ({err}); globs use only "
                           "[A-Za-z0-9_], '*' and '?' between dots") from None


def generalize(name: str) -> str:
    """``decoder.layers.3.mlp.act`` -> ``decoder.layers.*.mlp.act`` (numeric parts become ``*``)."""
    return ".".join("*" if p.isdigit() else p for p in name.split("."))


def close_names(text: str, names: Iterable[str], n: int = 5) -> List[str]:
    """Names (layer indices written as ``*``) that look like ``text``, best first."""
    candidates = []
    for name in dict.fromkeys(generalize(x) for x in names if x):
        parts = name.split(".")
        candidates.extend(".".join(parts[i:]) for i in range(len(parts)))
    candidates = list(dict.fromkeys(candidates))
    probe = text[3:] if text.startswith("re:") else text[5:] if text.startswith("glob:") else text
    probe = probe.replace("\\.", ".").replace(".*", "*")
    found = difflib.get_close_matches(probe, candidates, n=n, cutoff=0.45)
    if not found:   # fall back on shared name parts
        words = set(re.findall(r"[A-Za-z]{3,}", probe))
        found = [c for c in candidates if words & set(re.findall(r"[A-Za-z]{3,}", c))][:n]
    return found


def no_match_error(where: str, pattern: Pattern, names: Sequence[str], owner: str) -> PatternError:
    close = close_names(pattern.text, names)
    hint = f" Close names: {', '.join(close)}." if close else ""
    return PatternError(
        f"{where} pattern {pattern.text!r} (read as a {pattern.kind}) matches no Cell of {owner}.{hint} "
        "A pattern matches a qualified Cell name (model.cells_and_names()) or a dotted suffix of it; in a glob "
        "'*' is one name part and '**' any number of parts; 're:' starts a regular expression. Operations "
        "computed inline in a construct (not sub-Cells) have no name and cannot be chosen.")


# ---- layer selections ------------------------------------------------------------------------
LayerSel = Union[None, bool, str, Sequence[int], range]
ALL_LAYERS = "all"


@dataclass(frozen=True)
class Layers:
    """A normalized layer selection: ``anywhere`` (no restriction), ``all`` (inside any layer) or
    the explicit global layer ``ids``."""
    anywhere: bool = False
    all: bool = False
    ids: FrozenSet[int] = frozenset()

    def admits(self, layer: Optional[int]) -> bool:
        if self.anywhere:
            return True
        if layer is None:
            return False
        return self.all or layer in self.ids

    @property
    def empty(self) -> bool:
        return not (self.anywhere or self.all or self.ids)

    def __str__(self) -> str:
        if self.anywhere:
            return "anywhere"
        if self.all:
            return "all layers"
        return f"layers {format_layer_ranges(sorted(self.ids))}" if self.ids else "no layers"


def layers_of(sel: LayerSel, where: str = "layers") -> Layers:
    """Normalize a layer selection (see the module docstring); errors name ``where``."""
    if sel is None:
        return Layers(anywhere=True)
    if sel is True:
        return Layers(all=True)
    if sel is False:
        return Layers()
    if isinstance(sel, str):
        if sel.strip().lower() in (ALL_LAYERS, "*", "true"):
            return Layers(all=True)
        try:
            return Layers(ids=frozenset(parse_layer_ranges(sel)))
        except ValueError as err:
            raise PatternError(f"{where}={sel!r}: {err}") from None
    if isinstance(sel, (list, tuple, range, set, frozenset)) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in sel):
        return Layers(ids=frozenset(sel))
    raise PatternError(f"{where}={sel!r}: a layer selection is None (anywhere), True/'all' (every layer), "
                       "False (none), a range string such as '0-3,8-11', or a list of non-negative ints")


# ---- MindFormers operator names -> this package's Cell names ------------------------------------
# Whole-pattern translations of MindFormers' default select / comm patterns (layer-relative regexes).
MINDFORMERS_PATTERNS = {
    r"feed_forward\.mul": r"mlp\.act",
    r"feed_forward\.w1\.activation\.silu": r"mlp\.act",
    r"mlp\.mul": r"mlp\.act",
    r"mlp\.activation_func\.silu": r"mlp\.act",
    r".*\.norm": r".*layernorm",
    r"attention\.flash_attention": r"self_attention\.core_attention",
    r"flash_attention": r"core_attention",
}
# Name parts of MindFormers' Llama (legacy and mcore) -> the parts used in mindformers_core.transformer.
MINDFORMERS_PARTS = {
    "feed_forward": "mlp", "attention": "self_attention", "w1": "linear_fc1_gate", "w3": "linear_fc1_up",
    "w2": "linear_fc2", "wq": "linear_q", "wk": "linear_k", "wv": "linear_v", "wo": "linear_proj",
    "attention_norm": "input_layernorm", "ffn_norm": "pre_mlp_layernorm", "flash_attention": "core_attention",
    "activation": "act", "activation_func": "act", "linear_qkv": "linear_q",
}
# Trailing primitive names: in our model these operations are the body of the Cell before them.
PRIMITIVE_TAILS = {"matmul", "mul", "silu", "gelu", "norm", "softmax", "cast", "add", "reshape", "transpose",
                   "batch_matmul", "bmm", "rms_norm", "layer_norm", "dropout"}


def translate_mindformers(pattern: str):
    """A MindFormers layer-relative operator pattern (``'feed_forward\\.w1\\.matmul'``) as a regex over
    our Cell names relative to a layer (``'mlp\\.linear_fc1_gate'``), and a note on what changed
    (``''`` when nothing did)."""
    if pattern in MINDFORMERS_PATTERNS:
        new = MINDFORMERS_PATTERNS[pattern]
        return new, f"MindFormers pattern {pattern!r} -> {new!r}"
    parts = pattern.split(r"\.")
    new_parts = [MINDFORMERS_PARTS.get(p, p) for p in parts]
    dropped = []
    while len(new_parts) > 1 and new_parts[-1] in PRIMITIVE_TAILS:
        dropped.insert(0, new_parts.pop())
    new = r"\.".join(new_parts)
    if new == pattern:
        return pattern, ""
    note = f"MindFormers pattern {pattern!r} -> {new!r}"
    if dropped:
        note += f" (operation {'.'.join(dropped)!r} is the body of that Cell; the whole Cell is chosen)"
    return new, note


def layer_relative(regex: str) -> str:
    """A ``re:`` pattern matching ``regex`` below any transformer layer (``...layers.<i>.``)."""
    return r"re:(?:.*\.)?layers\.\d+\." + regex
