"""Parallelize models that do not define ``shard()``: a plan maps Cell-name patterns to styles.

``parallelize(model, config, sample, plan={"layers.*.attention.linear_q": ColWiseParallel(), ...})``
turns each style into the same declarations a ``shard()`` method would return, then propagation
derives everything else. Patterns are matched against qualified Cell names: ``*`` matches one
name component (``layers.*.mlp``), ``**`` any number, and a pattern starting with ``re:`` is a
regular expression over the whole name. A pattern that matches nothing is an error listing the
closest names — a typo never silently leaves a layer unsharded.
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from mindspore import nn

from .layout import Layout
from .propagation import Declaration, PlanError


class ParallelStyle:
    """How one Cell is split. ``declare(cell, path, mesh)`` returns its :class:`Declaration`."""

    def declare(self, cell, path: str, mesh: Layout) -> Declaration:   # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement declare(cell, path, mesh) (abstract base)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _linear_weight(cell, path: str) -> Tuple[object, bool]:
    """The cell's weight and whether it is stored ``(out, in)`` (``nn.Dense``, ``transpose_b``)."""
    weight = getattr(cell, "weight", None)
    if weight is None or len(weight.shape) != 2:
        raise PlanError(f"{path}: a ColWise/RowWise style needs a Cell with a 2-D `weight` (a linear layer); "
                        f"{type(cell).__name__} has {None if weight is None else tuple(weight.shape)}")
    if isinstance(cell, nn.Dense):
        return weight, True
    attrs = cell.sharding_attrs() if hasattr(cell, "sharding_attrs") else {}
    return weight, bool(attrs.get("transpose_b", True))


def _tp(mesh: Layout, axis: str, path: str) -> None:
    if axis not in mesh.alias_name:
        raise PlanError(f"{path}: mesh axis {axis!r} is not in the mesh {mesh.alias_name}")


@dataclass(repr=False)
class ColWiseParallel(ParallelStyle):
    """Output features split over ``axis``: ``y[..., j]`` computed where column ``j`` lives."""
    axis: str = "tp"

    def declare(self, cell, path, mesh):
        _tp(mesh, self.axis, path)
        weight, out_first = _linear_weight(cell, path)
        dims = (self.axis, "None") if out_first else ("None", self.axis)
        weights = {"weight": mesh(*dims)}
        if getattr(cell, "bias", None) is not None:
            weights["bias"] = mesh(self.axis)
        return Declaration(path, weights=weights)


@dataclass(repr=False)
class RowWiseParallel(ParallelStyle):
    """Input features split over ``axis``; the partial sums are reduced into ``output``:
    ``"replicate"`` (all-reduce) or ``"sequence"`` (reduce-scatter along the sequence dim 1)."""
    axis: str = "tp"
    output: str = "replicate"

    def declare(self, cell, path, mesh):
        _tp(mesh, self.axis, path)
        weight, out_first = _linear_weight(cell, path)
        if getattr(cell, "bias", None) is not None:
            raise PlanError(f"{path}: RowWiseParallel on a linear with a bias is not supported (the bias would be "
                            f"added once per partial sum); build it without bias or use NoParallel()")
        if getattr(cell, "activation_flag", False):
            raise PlanError(f"{path}: RowWiseParallel on an nn.Dense with activation={cell.activation!r} is not "
                            f"supported (the activation would run on partial sums before their reduction); "
                            f"build it without activation and apply it after the Cell")
        if self.output not in ("replicate", "sequence"):
            raise PlanError(f"{path}: RowWiseParallel(output={self.output!r}); valid: 'replicate', 'sequence'")
        dims = ("None", self.axis) if out_first else (self.axis, "None")
        batch = "dp" if "dp" in mesh.alias_name else "None"
        out = mesh(batch, self.axis, "None") if self.output == "sequence" else mesh(batch, "None", "None")
        return Declaration(path, outputs=(out,), weights={"weight": mesh(*dims)})


@dataclass(repr=False)
class SequenceParallel(ParallelStyle):
    """Inputs and outputs split along the sequence dim (dim 1 of ``(batch, seq, hidden)``) over
    ``axis``: norms and dropout between a row-parallel output and a column-parallel input."""
    axis: str = "tp"

    def declare(self, cell, path, mesh):
        _tp(mesh, self.axis, path)
        batch = "dp" if "dp" in mesh.alias_name else "None"
        seq = mesh(batch, self.axis, "None")
        return Declaration(path, inputs=(seq,), outputs=(seq,))


@dataclass(repr=False)
class PrepareInput(ParallelStyle):
    """Redistribute the Cell's tensor arguments to ``layouts`` (one per argument, None = derive)."""
    layouts: Sequence[Optional[Layout]] = ()

    def declare(self, cell, path, mesh):
        return Declaration(path, inputs=tuple(self.layouts))


@dataclass(repr=False)
class NoParallel(ParallelStyle):
    """Every weight of the Cell (its own, not its children's) replicated."""

    def declare(self, cell, path, mesh):
        weights = {}
        for name, p in cell.parameters_and_names(expand=False):
            attr = name.rsplit(".", 1)[-1]
            weights[attr] = mesh(*(["None"] * len(p.shape)))
        return Declaration(path, weights=weights)


@dataclass(repr=False)
class ExpertParallel(ParallelStyle):
    """Plan style for a ``moe_experts`` Cell (``RoutedExperts``): the expert dim (0) of its weights
    split over ``axis``; tokens are routed to the ranks holding their experts by all-to-all."""
    axis: str = "ep"

    def declare(self, cell, path, mesh):
        if getattr(type(cell), "sharding_op", None) != "moe_experts":
            raise PlanError(f"{path}: ExpertParallel() applies to a routed-experts Cell (sharding_op "
                            f"'moe_experts'), not {type(cell).__name__}")
        if self.axis not in mesh.alias_name:
            raise PlanError(f"{path}: mesh axis {self.axis!r} is not in the mesh {mesh.alias_name}; plan on "
                            f"expert_mesh(dp, cp, tp, ep) or a config with expert_model_parallel_size > 1")
        return Declaration(path, weights={n: mesh(self.axis, "None", "None")
                                          for n in getattr(cell, "sharding_params", ())})

def _pattern(pattern: str):
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:])
        return lambda name: rx.fullmatch(name) is not None
    parts = pattern.split(".")
    if "**" not in parts:
        return lambda name: len(name.split(".")) == len(parts) and all(
            fnmatch.fnmatchcase(n, p) for n, p in zip(name.split("."), parts))
    rx = re.compile("^" + r"\.".join(".*" if p == "**" else fnmatch.translate(p)[4:-3] for p in parts) + "$")
    return lambda name: rx.match(name) is not None


def match_plan(model: nn.Cell, plan: Mapping[str, ParallelStyle]) -> Dict[str, Tuple[str, ParallelStyle]]:
    """``{cell path: (pattern, style)}``; every pattern must match, no Cell may match twice."""
    names = [n for n, _ in model.cells_and_names() if n]
    out: Dict[str, Tuple[str, ParallelStyle]] = {}
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise PlanError(f"plan[{pattern!r}] = {style!r} is not a style; use ColWiseParallel(), RowWiseParallel(), "
                            f"SequenceParallel(), PrepareInput(...) or NoParallel()")
        test = _pattern(pattern)
        hits = [n for n in names if test(n)]
        if not hits:
            close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.4)
            raise PlanError(f"plan pattern {pattern!r} matches no Cell of {type(model).__name__}; closest names: "
                            f"{close or names[:8]}")
        for n in hits:
            if n in out:
                raise PlanError(f"Cell {n!r} is matched by two plan patterns: {out[n][0]!r} and {pattern!r}")
            out[n] = (pattern, style)
    return out


def plan_declarations(model: nn.Cell, plan: Mapping[str, ParallelStyle], mesh: Layout) -> Dict[int, Declaration]:
    """The plan's styles as declarations keyed by Cell object id (what propagation consumes)."""
    cells = dict(model.cells_and_names())
    return {id(cells[path]): style.declare(cells[path], path, mesh)
            for path, (_, style) in match_plan(model, plan).items()}
