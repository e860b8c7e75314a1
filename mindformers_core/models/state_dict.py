"""A family's Hugging Face state-dict adapter: a table of names, HF <-> ours, on NumPy dicts.

Each row is a :class:`NameRule`: our parameter name and the Hugging Face name, as patterns whose
``{i}`` (any ``{name}``) stands for an integer -- the global, 0-based layer index in
``decoder.layers.{i}.…`` <-> ``model.layers.{i}.…`` -- and whether the tensor is transposed
(Hugging Face's ``nn.Linear`` stores ``(out, in)``, ours ``(in, out)``). A
:class:`StateDictAdapter` holds a family's rows; the converter (``research/llama/convert_weight.py``),
the loader and exporter and the tests read the same table.

A row maps one tensor of ours to one Hugging Face tensor. Stacked tensors -- our routed experts are one
``(E, in, out)`` tensor per projection, Hugging Face stores ``experts.{e}.…`` one per expert -- are a
:class:`StackedRule`. Every rule can also build just a *region* of our tensor from slices of the
Hugging Face tensors (``read``): that is how a rank of a parallel job loads only what it holds. Given
``out`` (an array of the region's shape in the dtype wanted), ``read`` fills it in blocks of rows of the
Hugging Face tensor, converting on the way (bfloat16 -> float32 through the bits): a tensor is never held
twice, only one block besides ``out``. Pure NumPy; no MindSpore.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Rule", "NameRule", "StackedRule", "StateDictAdapter", "layer_rules", "Region", "HFReader"]

Region = Tuple[Tuple[int, int], ...]           # per dim (start, stop) of a global tensor
HFReader = Callable[[str, Optional[Tuple[slice, ...]]], np.ndarray]   # (hf name, slices or None) -> array

_FIELD = re.compile(r"\{(\w+)\}")


@lru_cache(maxsize=None)
def _compile(pattern: str) -> "re.Pattern":
    parts, last = [], 0
    for m in _FIELD.finditer(pattern):
        parts += [re.escape(pattern[last:m.start()]), f"(?P<{m.group(1)}>\\d+)"]
        last = m.end()
    return re.compile("".join(parts + [re.escape(pattern[last:])]))


def _match(pattern: str, name: str) -> Optional[Dict[str, int]]:
    """The integer fields of ``name`` under ``pattern`` (None when it does not match)."""
    m = _compile(pattern).fullmatch(name)
    return None if m is None else {k: int(v) for k, v in m.groupdict().items()}


READ_BLOCK_BYTES = 64 << 20       # ``read(..., out=)``: rows of a Hugging Face tensor read at a time
TRANSPOSE_ROWS = 64               # rows of a block transposed at a time (2x faster than a whole block)


def cast_into(src: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = src`` in ``out``'s dtype (any strides); bfloat16 -> float32 exactly through the bits (the
    upper half of a float32), which is much faster than a cast through MindSpore's NumPy bfloat16."""
    src = np.asarray(src)
    if src.dtype.name == "bfloat16" and out.dtype == np.float32:
        np.left_shift(src.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, src, casting="unsafe")


def read_into(reader: "HFReader", hf: str, slices: Tuple[slice, ...], transpose: bool, out: np.ndarray
              ) -> np.ndarray:
    """``out`` (our region: C-contiguous, in its final dtype) from ``slices`` of the Hugging Face tensor ``hf``
    (in its order), transposed or not, read in blocks of its dim-0 rows (``READ_BLOCK_BYTES`` of ``out``)."""
    if out.ndim == 0 or not slices:
        cast_into(reader(hf, tuple(slices)), out)
        return out
    first, stop = slices[0].start or 0, slices[0].stop
    hf_shape = out.shape[::-1] if transpose else out.shape
    rows = max(1, READ_BLOCK_BYTES // max(1, int(np.prod(hf_shape[1:], dtype=np.int64)) * out.itemsize))
    for a in range(first, stop, rows):
        b = min(a + rows, stop)
        block = reader(hf, (slice(a, b),) + tuple(slices[1:]))
        if transpose:        # a transposed write, cache-friendly in bands of TRANSPOSE_ROWS rows
            block = np.asarray(block)
            for c in range(0, b - a, TRANSPOSE_ROWS):
                d = min(c + TRANSPOSE_ROWS, b - a)
                cast_into(block[c:d].T, out[..., a - first + c:a - first + d])
        else:
            cast_into(block, out[a - first:b - first])
        del block
    return out


def _flip(array, transpose: bool) -> np.ndarray:
    """Hugging Face's (out, in) <-> our (in, out) for a transposed row; contiguous either way."""
    array = np.asarray(array)
    return np.ascontiguousarray(array.T if transpose else array)


class Rule(ABC):
    """One kind of row (an abstract interface: NameRule and StackedRule implement it). ``match_ours(name)`` / ``match_hf(name)``: the integer fields of a name the
    rule covers (None when it does not); ``ours(fields)``: our name; ``hf_sources(fields)``: the
    Hugging Face names one of ours is built from; ``to_hf(fields, array)``: ``{hf name: array}``;
    ``from_hf(fields, arrays)``: ours from the arrays of ``hf_sources``, in that order."""

    @abstractmethod
    def match_ours(self, name: str) -> Optional[Dict[str, int]]:
        ...

    @abstractmethod
    def match_hf(self, name: str) -> Optional[Dict[str, int]]:
        ...

    @abstractmethod
    def ours(self, fields: Mapping[str, int]) -> str:
        ...

    @abstractmethod
    def hf_sources(self, fields: Mapping[str, int], shape: Optional[Tuple[int, ...]] = None) -> List[str]:
        ...

    @abstractmethod
    def to_hf(self, fields: Mapping[str, int], array: np.ndarray) -> Dict[str, np.ndarray]:
        ...

    @abstractmethod
    def from_hf(self, fields: Mapping[str, int], arrays: Sequence[np.ndarray]) -> np.ndarray:
        ...

    @abstractmethod
    def read(self, fields: Mapping[str, int], shape: Tuple[int, ...], region: Region, reader: HFReader,
             out: Optional[np.ndarray] = None) -> np.ndarray:
        """The ``region`` of our tensor (global ``shape``) from slices of the Hugging Face tensors
        (``reader(hf name, slices)``): only what the region needs is read. ``out``: fill this array (the
        region's shape, C-contiguous, the dtype wanted) block by block and return it; else a new array in
        the file's dtype."""
        ...

    @abstractmethod
    def hf_shapes(self, fields: Mapping[str, int], shape: Tuple[int, ...]) -> Dict[str, Tuple[int, ...]]:
        """The Hugging Face name and shape of each source of our tensor of global ``shape``."""
        ...


@dataclass(frozen=True)
class PatternPairRule(Rule, ABC):
    """A rule whose tensor of ours is read from one tensor of the other side, each named by a pattern with the
    same fields (the naming half of :class:`NameRule` and of MindFormers' fused and stacked rules)."""
    ours_pattern: str
    hf_pattern: str

    def __post_init__(self):
        if set(_FIELD.findall(self.ours_pattern)) != set(_FIELD.findall(self.hf_pattern)):
            raise ValueError(f"{type(self).__name__}: {self.ours_pattern!r} and {self.hf_pattern!r} must use the "
                             "same fields")

    def match_ours(self, name):
        return _match(self.ours_pattern, name)

    def match_hf(self, name):
        return _match(self.hf_pattern, name)

    def ours(self, fields):
        return self.ours_pattern.format(**fields)

    def hf_sources(self, fields, shape=None):
        return [self.hf_pattern.format(**fields)]


@dataclass(frozen=True)
class NameRule(PatternPairRule):
    """One tensor of ours is one Hugging Face tensor, transposed (2-D) or not."""
    transpose: bool = False

    def _flip(self, array):
        return _flip(array, self.transpose)

    def to_hf(self, fields, array):
        return {self.hf_pattern.format(**fields): self._flip(array)}

    def from_hf(self, fields, arrays):
        return self._flip(arrays[0])

    def read(self, fields, shape, region, reader, out=None):
        slices = tuple(slice(a, b) for a, b in region)
        slices = slices[::-1] if self.transpose else slices
        if out is not None:
            return read_into(reader, self.hf_pattern.format(**fields), slices, self.transpose, out)
        return self._flip(reader(self.hf_pattern.format(**fields), slices))

    def hf_shapes(self, fields, shape):
        return {self.hf_pattern.format(**fields): tuple(shape)[::-1] if self.transpose else tuple(shape)}


@dataclass(frozen=True)
class StackedRule(Rule):
    """One tensor of ours, ``(E, ...)``, stacks E Hugging Face tensors named by ``{e}`` (routed experts:
    ours ``decoder.layers.{i}.mlp.experts.w_gate`` (E, h, f) <- ``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``
    (f, h) each, transposed). ``stack_field`` names the stacked index in ``hf_pattern``."""
    ours_pattern: str
    hf_pattern: str
    transpose: bool = False
    stack_field: str = "e"

    def __post_init__(self):
        ours, hf = set(_FIELD.findall(self.ours_pattern)), set(_FIELD.findall(self.hf_pattern))
        if hf != ours | {self.stack_field} or self.stack_field in ours:
            raise ValueError(f"StackedRule: {self.hf_pattern!r} must use the fields of {self.ours_pattern!r} plus "
                             f"{{{self.stack_field}}}")

    def match_ours(self, name):
        return _match(self.ours_pattern, name)

    def match_hf(self, name):
        return _match(self.hf_pattern, name)

    def ours(self, fields):
        return self.ours_pattern.format(**{k: v for k, v in fields.items() if k != self.stack_field})

    def _name(self, fields, e):
        return self.hf_pattern.format(**dict(fields, **{self.stack_field: e}))

    def hf_sources(self, fields, shape=None):
        if shape is None:
            raise ValueError(f"StackedRule {self.ours_pattern!r}: the number of stacked tensors comes from our shape")
        return [self._name(fields, e) for e in range(shape[0])]

    def _flip(self, array):
        return _flip(array, self.transpose)

    def to_hf(self, fields, array):
        return {self._name(fields, e): self._flip(array[e]) for e in range(np.shape(array)[0])}

    def from_hf(self, fields, arrays):
        return np.stack([self._flip(a) for a in arrays])

    def read(self, fields, shape, region, reader, out=None):
        inner = tuple(slice(a, b) for a, b in region[1:])
        inner = inner[::-1] if self.transpose else inner
        if out is not None:
            for k, e in enumerate(range(*region[0])):
                read_into(reader, self._name(fields, e), inner, self.transpose, out[k])
            return out
        return np.stack([self._flip(reader(self._name(fields, e), inner)) for e in range(*region[0])])

    def hf_shapes(self, fields, shape):
        one = tuple(shape[1:])[::-1] if self.transpose else tuple(shape[1:])
        return {self._name(fields, e): one for e in range(shape[0])}


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

    def hf_names(self, name: str, shape: Optional[Tuple[int, ...]] = None) -> List[str]:
        """The Hugging Face names our parameter ``name`` (of global ``shape``: stacked tensors need it) is
        stored under."""
        rule, fields = self._ours(name)
        return rule.hf_sources(fields, shape)

    def hf_shapes(self, name: str, shape: Tuple[int, ...]) -> Dict[str, Tuple[int, ...]]:
        """``{hf name: hf shape}`` of the sources of our parameter ``name`` of global ``shape``."""
        rule, fields = self._ours(name)
        return rule.hf_shapes(fields, tuple(shape))

    def read(self, name: str, shape: Tuple[int, ...], region: Region, reader: HFReader,
             out: Optional[np.ndarray] = None) -> np.ndarray:
        """The ``region`` of our parameter ``name`` (global ``shape``) read through ``reader``; a Hugging
        Face name the reader does not hold (``KeyError``) is read from its fallback when it has one.
        ``out``: fill it (see :meth:`Rule.read`)."""
        rule, fields = self._ours(name)

        def with_fallback(hf, slices):
            try:
                return reader(hf, slices)
            except KeyError:
                if hf in self.fallbacks:
                    return reader(self.fallbacks[hf], slices)
                raise
        return rule.read(fields, tuple(shape), tuple(tuple(r) for r in region), with_fallback, out=out)

    def ours_of_hf(self, hf: str) -> Optional[str]:
        """Our name for a Hugging Face tensor name (None: ignored by this family; KeyError: no row)."""
        if any(_compile(p).fullmatch(hf) for p in self.ignored):
            return None
        for rule in self.rules:
            fields = rule.match_hf(hf)
            if fields is not None:
                return rule.ours(fields)
        raise KeyError(f"Hugging Face tensor {hf!r}: no row of this family's table names it")

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
            if isinstance(rule, StackedRule):     # the stacked count: the Hugging Face tensors present
                count = 0
                while rule._name(fields, count) in hf_state:
                    count += 1
                sources = rule.hf_sources(fields, (count,))
            else:
                sources = rule.hf_sources(fields)
            out[name] = rule.from_hf(fields, [self._source(hf_state, hf, name) for hf in sources])
        return out
