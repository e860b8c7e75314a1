"""Resolving rules against a model's Cell names: which Cells become recompute / swap units, which
were skipped and why. The result, a :class:`Report`, can be printed before anything runs.

The model is seen as a :class:`Tree` of qualified names (built from ``cells_and_names()`` by
:func:`mindformers_core.recompute.api.model_tree`, or from plain names in tests). Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..common.placement import format_layer_ranges
from .config import Rule
from .patterns import PatternError, compile_pattern, no_match_error


def parent_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def ancestors(name: str) -> List[str]:
    """Proper ancestors, nearest first (the root ``""`` last)."""
    out = []
    while name:
        name = parent_of(name)
        out.append(name)
    return out


@dataclass
class Tree:
    """Qualified Cell names in model order (root ``""`` included), the containers among them
    (CellList & co., never units), the transformer layers (name -> global 0-based id), the blocks
    holding them, and each Cell's class name."""
    names: List[str]
    containers: frozenset = frozenset()
    layers: Dict[str, int] = field(default_factory=dict)
    blocks: List[str] = field(default_factory=list)
    classes: Dict[str, str] = field(default_factory=dict)
    owner: str = "the model"

    def __post_init__(self):
        if "" not in self.names:
            self.names = [""] + list(self.names)
        self._layer_of: Dict[str, Optional[int]] = {}
        self._children: Dict[str, List[str]] = {n: [] for n in self.names}
        for n in self.names:
            if n:
                self._children.setdefault(parent_of(n), []).append(n)
            lid = None
            for a in [n] + ancestors(n):
                if a in self.layers:
                    lid = self.layers[a]
                    break
            self._layer_of[n] = lid

    @classmethod
    def from_names(cls, names: Sequence[str], owner: str = "the model") -> "Tree":
        """A tree from names alone: ``...layers.<i>`` are layers (id i), ``...layers`` containers."""
        names = list(names)
        layers, blocks, containers = {}, [], set()
        for n in names:
            parts = n.split(".")
            if len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit():
                layers[n] = int(parts[-1])
                containers.add(parent_of(n))
                block = parent_of(parent_of(n))
                if block not in blocks:
                    blocks.append(block)
        return cls(names, frozenset(containers), layers, blocks, owner=owner)

    def layer_of(self, name: str) -> Optional[int]:
        return self._layer_of.get(name)

    def children(self, name: str) -> List[str]:
        return self._children.get(name, [])

    @property
    def candidates(self) -> List[str]:
        return [n for n in self.names if n and n not in self.containers]

    def held_layers(self) -> str:
        ids = sorted(self.layers.values())
        return format_layer_ranges(ids) if ids else "none"


@dataclass
class Unit:
    """A Cell that becomes a recompute (or swap) unit, why, and its global layer id."""
    name: str
    layer: Optional[int]
    cls: str
    reasons: List[str]


@dataclass
class Report:
    """What ``apply_recompute`` / ``apply_swap`` chose. ``units`` are applied; ``skipped`` lists
    ``(name, why)`` for matches that were not; ``matched`` counts units per rule; ``notes`` are
    translations and caveats. ``str(report)`` is a table."""
    kind: str
    units: List[Unit] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    matched: Dict[str, int] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    @property
    def names(self) -> List[str]:
        return [u.name for u in self.units]

    def __len__(self) -> int:
        return len(self.units)

    def __str__(self) -> str:
        lines = [f"{self.kind}: {len(self.units)} unit(s)"]
        if self.units:
            w = max(len(u.name) for u in self.units)
            lines.append(f"  {'cell'.ljust(w)}  layer  class               chosen by")
            for u in self.units:
                layer = "-" if u.layer is None else str(u.layer)
                lines.append(f"  {u.name.ljust(w)}  {layer:>5}  {u.cls[:18]:<18}  {'; '.join(u.reasons)}")
        for rule, n in self.matched.items():
            lines.append(f"  rule {rule}: {n} unit(s)")
        for name, why in self.skipped:
            lines.append(f"  skipped {name or '<root>'}: {why}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)


def _select(tree: Tree, rule: Rule, strict: bool, where: str, notes: List[str]) -> List[str]:
    pattern = compile_pattern(rule.pattern, where)
    hits = [n for n in tree.candidates if pattern.matches(n)]
    if not hits:
        if strict:
            raise no_match_error(where, pattern, tree.candidates, tree.owner)
        notes.append(f"{rule.source}: matches no Cell")
        return []
    kept = [n for n in hits if rule.layers.admits(tree.layer_of(n))]
    if not kept:
        notes.append(f"{rule.source}: matches {len(hits)} Cell(s), none in {rule.layers} "
                     f"(this model holds layers {tree.held_layers()})")
    return kept


def resolve(tree: Tree, rules: Sequence[Rule], exclusions: Sequence[Rule], strict: bool = True,
            kind: str = "recompute", notes: Sequence[str] = ()) -> Report:
    """Units for ``rules`` minus ``exclusions`` on ``tree`` (see :class:`Report`)."""
    report = Report(kind, notes=list(notes))
    chosen: Dict[str, List[str]] = {}
    for rule in rules:
        if rule.kind == "full":
            if not tree.layers and not tree.blocks:
                raise PatternError(f"{kind} {rule.source}: {tree.owner} has no transformer layers (no Cell list "
                                   "named 'layers'); choose Cells with select patterns instead")
            names = [n for n, lid in tree.layers.items() if rule.layers.admits(lid)]
            if not names:
                report.notes.append(f"{rule.source}: none of {rule.layers} is held by this model "
                                    f"(it holds layers {tree.held_layers()})")
        elif rule.kind == "stage":
            if not tree.blocks:
                raise PatternError(f"{kind} {rule.source}: {tree.owner} has no block of transformer layers "
                                   "(no Cell list named 'layers')")
            names = list(tree.blocks)
        else:
            names = _select(tree, rule, strict, f"{kind} select", report.notes)
        report.matched[rule.source] = len(names)
        for n in names:
            chosen.setdefault(n, []).append(rule.source)
    excluded: Dict[str, str] = {}
    for rule in exclusions:
        for n in _select(tree, rule, strict, f"{kind} exclude", report.notes):
            excluded[n] = rule.source
    order = {n: i for i, n in enumerate(tree.names)}
    units: List[str] = []
    for n in sorted(chosen, key=order.get):
        hit = next((a for a in [n] + ancestors(n) if a in excluded), None)
        if hit is not None:
            report.skipped.append((n, f"excluded by {excluded[hit]}" + ("" if hit == n else f" (via {hit})")))
            continue
        outer = next((a for a in ancestors(n) if a in chosen), None)
        if outer is not None:
            report.skipped.append((n, f"inside unit {outer or '<root>'} ({'; '.join(chosen[outer])})"))
            continue
        inner = [e for e in excluded if e.startswith(n + ".") or (n == "" and e)]
        if inner:
            parts = _split(tree, n, excluded)
            report.notes.append(f"{n or '<root>'} split into {len(parts)} unit(s) to exclude "
                                f"{', '.join(sorted(inner))}; operations computed inline in its construct are "
                                "then not recomputed")
            for p in parts:
                chosen.setdefault(p, list(chosen[n]))
            units.extend(parts)
            continue
        units.append(n)
    for n in units:
        report.units.append(Unit(n, tree.layer_of(n), tree.classes.get(n, ""), chosen[n]))
    return report


def _split(tree: Tree, name: str, excluded: Mapping[str, str]) -> List[str]:
    out = []
    for child in tree.children(name):
        if child in excluded:
            continue
        if child in tree.containers or any(e.startswith(child + ".") for e in excluded):
            out.extend(_split(tree, child, excluded))
        else:
            out.append(child)
    return out
