"""Sharding propagation over a traced graph: declared layouts are fixed, the rest is derived.

Semantics (MindSpore's sharding propagation, applied to tensors rather than operators):

* Fixed points: the model inputs' layouts, and what Cells declare through ``shard(config)``
  (their inputs, outputs and weights).
* Every other tensor gets its layout from the op rules, walking the graph in execution order
  (breadth-first from the inputs and declared points); each rule picks, among its candidates, the
  one with the fewest redistribution bytes on its input edges. Undecided parameters and constants
  take the layout their first consumer prefers (no communication: they are sliced once).
* Where an op needs an input in another layout than the one arriving, the conversion is placed
  at the Cell boundary the tensor just crossed (a derived boundary adopts its first consumer's
  layout); where a declared layout meets a different derived one, a redistribution is inserted at
  that boundary. A conversion needed between two ops of the same ``construct`` has no Cell
  boundary to run at: :class:`PlanError` says which op and which Cell to declare on.
* Backward: a tensor replicated over a mesh axis that its consumer splits (e.g. ``x`` entering a
  column-parallel matmul) receives a gradient that is partial (sum) over that axis. The pass
  computes these gradient layouts in reverse; each boundary's backward converts the arriving
  gradient (its target layout, partial where the consumer split) back to the source layout —
  Megatron's ``f``/``g`` pairs fall out of this rule. Parameters record the axes their gradients
  must still be summed over (``grad_axes``: dp for every replicated weight, tp for a
  sequence-parallel norm weight, ...). A parameter passed to a Cell as an argument (the embedding
  table a tied output layer multiplies by) is a weight too: its boundary leaves the gradient partial
  over the axes the parameter is replicated on, and those join its ``grad_axes`` (summed once with
  its other uses' contributions, e.g. the lookup's), instead of being reduced at the boundary.

* Shapes the code reads: a reshape sized from another tensor's shape (``s = x.shape[1]``, recorded by the
  tracer) must get, from that tensor's planned local shape, the reshape's planned local shape; otherwise
  :class:`PlanError` (the run would build another shape).

Pure Python: no process group is needed to plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from mindspore import nn

from .layout import Layout, as_layout
from .redistribution import RedistributionPlan, plan_redistribution
from .rules import RuleResult, infer
from .rules.common import make_layout
from .trace import Graph, Node

_ITEMSIZE = {"Float32": 4, "Float16": 2, "BFloat16": 2, "Float64": 8, "Int32": 4, "Int64": 8,
             "Bool": 1, "Int8": 1, "UInt8": 1, "Int16": 2}


class PlanError(ValueError):
    """Propagation found no consistent layout assignment that can be executed."""


def itemsize(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 4)


def is_float(dtype: str) -> bool:
    return "Float" in dtype


@dataclass
class Declaration:
    """What one Cell declared through ``shard(config)``."""
    path: str
    inputs: Tuple[Optional[Layout], ...] = ()
    outputs: Tuple[Optional[Layout], ...] = ()
    weights: Dict[str, Layout] = field(default_factory=dict)   # attribute name -> layout


@dataclass
class Redistribution:
    """A conversion at a Cell boundary, forward and backward."""
    node: int
    where: str
    shape: Tuple[int, ...]
    source: Layout
    target: Layout
    grad_partial: Tuple[str, ...]
    forward: RedistributionPlan
    backward: Optional[RedistributionPlan]
    grad_scale: float = 1.0
    declared: bool = False

    @property
    def bytes_per_rank(self) -> int:
        return self.forward.bytes_per_rank + (self.backward.bytes_per_rank if self.backward else 0)

    def describe(self) -> str:
        fwd = " then ".join(s.describe() for s in self.forward.steps) or "no-op"
        text = f"{self.where}: {self.source.describe()} -> {self.target.describe()} [{fwd}]"
        if self.backward is not None and self.backward.steps:
            bwd = " then ".join(s.describe() for s in self.backward.steps)
            text += f"; backward [{bwd}]"
        if self.grad_scale != 1.0:
            text += f"; backward x{self.grad_scale:g}"
        return text + f" ({self.bytes_per_rank} B/rank)"


@dataclass
class ShardingPlan:
    graph: Graph
    mesh: Layout
    layouts: Dict[int, Layout]
    declared: Set[int]
    results: Dict[int, RuleResult]
    redistributions: List[Redistribution]
    param_layouts: Dict[str, Layout]
    grad_axes: Dict[str, Tuple[str, ...]]
    const_layouts: Dict[int, Layout]

    @property
    def input_layouts(self) -> List[Layout]:
        return [self.layouts[t] for t in self.graph.inputs]

    @property
    def output_layouts(self) -> List[Layout]:
        return [self.layouts[t] for t in self.graph.outputs]

    @property
    def bytes_per_step(self) -> int:
        """Redistribution bytes per rank for one forward + backward."""
        return sum(r.bytes_per_rank for r in self.redistributions)

    def redistributions_of(self, call: int) -> List[Redistribution]:
        return [r for r in self.redistributions if self.graph.nodes[r.node].call == call]

    def explain(self) -> str:
        """Per Cell call: layouts of inputs, outputs and weights (declared or derived) and the
        redistributions inserted with their cost."""
        g = self.graph
        lines = [f"sharding plan on mesh {dict(zip(self.mesh.alias_name, self.mesh.device_matrix))}: "
                 f"{len(self.redistributions)} redistributions, {self.bytes_per_step} B/rank per step"]

        def tag(tid):
            return "declared" if tid in self.declared else "derived"

        for call in g.calls:
            kind = f" [{g.nodes[call.node].op}]" if call.atomic else ""
            lines.append(f"{call.path or '<model>'} ({type(call.cell).__name__}){kind}")
            for n in call.enter:
                t = g.nodes[n].outputs[0]
                lines.append(f"  input {g.nodes[n].arg}: {self.layouts[t].describe()} ({tag(t)})")
            for n in call.exit:
                t = g.nodes[n].outputs[0]
                lines.append(f"  output {g.nodes[n].arg}: {self.layouts[t].describe()} ({tag(t)})")
            for _, param in call.cell.parameters_and_names(expand=False):
                t = g.params.get(param.name)
                if t is not None:
                    lines.append(f"  weight {param.name}: {self.layouts[t].describe()} ({tag(t)}), grad summed "
                                 f"over {list(self.grad_axes.get(param.name, ())) or 'nothing'}")
            if call.atomic:
                node = g.nodes[call.node]
                local = self.results[node.index].local
                if local is not None:
                    lines.append(f"  local kernel: {local.name}")
            for r in self.redistributions_of(call.index):
                lines.append(f"  redistribute {r.describe()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def fit_layout(layout, ndim: int, mesh: Layout, what: str) -> Layout:
    """A declared layout for a tensor of rank ``ndim``. A layout with fewer entries describes the
    tensor as (tokens, ..., features): its first entry applies to dim 0, the others to the
    trailing dims, the dims in between are not split (the design's 2-D ``("cp_dp", "tp")`` on a
    ``(batch, seq, hidden)`` activation)."""
    layout = as_layout(layout)
    if (layout.device_matrix, layout.alias_name) != (mesh.device_matrix, mesh.alias_name):
        raise PlanError(f"{what}: layout {layout!r} is on device matrix {layout.device_matrix} with aliases "
                        f"{layout.alias_name}, but the model is planned on {mesh.device_matrix} with "
                        f"{mesh.alias_name}; build layouts from the same mesh")
    if list(layout.rank_list) != list(mesh.rank_list):
        # a declaration describes the tensor map; the plan's mesh decides which ranks hold it (a
        # pipeline stage's layers declare on config.layout, the stage plans on its own ranks)
        layout = make_layout(mesh, layout.dims, dict(layout.partial))
    if layout.ndim == ndim:
        return strip_unit_axes(layout)
    if layout.ndim == 0 or layout.ndim > ndim:
        raise PlanError(f"{what}: layout has {layout.ndim} entries for a {ndim}-dim tensor")
    dims = [layout.dims[0]] + [()] * (ndim - layout.ndim) + list(layout.dims[1:])
    return strip_unit_axes(make_layout(mesh, dims, dict(layout.partial)))


def _as_tuple(value) -> Tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def _normalize_declaration(path: str, cell, raw) -> Declaration:
    if raw is None:
        return Declaration(path)
    if not isinstance(raw, (tuple, list)) or len(raw) != 3:
        raise PlanError(f"{path or '<model>'}.shard(config) must return (input_layout, output_layout, "
                        f"weight_layout), each possibly None; got {raw!r}")
    ins, outs, weights = raw
    if weights is None:
        wmap = {}
    elif isinstance(weights, dict):
        wmap = dict(weights)
    else:
        own = [n for n, _ in cell.parameters_and_names(expand=False)]
        main = "weight" if "weight" in own else (own[0] if own else None)
        if main is None:
            raise PlanError(f"{path}: shard() gave a weight layout but the Cell has no parameters of its own")
        wmap = {main: weights}
    for name in wmap:
        if not hasattr(cell, name) or getattr(cell, name) is None:
            own = [n for n, _ in cell.parameters_and_names(expand=False)]
            raise PlanError(f"{path}: shard() declares a layout for weight {name!r}, which the Cell does not "
                            f"have; its parameters: {own}")
    return Declaration(path, _as_tuple(ins), _as_tuple(outs),
                       {k: v for k, v in wmap.items() if v is not None})


def collect_declarations(graph: Graph, config) -> Dict[int, Declaration]:
    """``cell.shard(config)`` for every Cell called during the trace (once per Cell object).
    MindSpore's own ``Cell.shard(in_strategy, ...)`` (graph-mode strategies) is not ours: skipped."""
    out: Dict[int, Declaration] = {}
    for call in graph.calls:
        key = id(call.cell)
        if key in out or getattr(type(call.cell), "shard", nn.Cell.shard) is nn.Cell.shard:
            continue
        out[key] = _normalize_declaration(call.path, call.cell, call.cell.shard(config))
    return out


def propagate(graph: Graph, mesh: Layout, declarations: Dict[int, Declaration],
              input_layouts: Sequence[Optional[Layout]] = (),
              output_layouts: Sequence[Optional[Layout]] = ()) -> ShardingPlan:
    """Assign a layout to every tensor of ``graph`` and list the redistributions (see module doc)."""
    L: Dict[int, Optional[Layout]] = {}
    declared: Set[int] = set()
    adjustable: Dict[int, int] = {}       # boundary output tid -> node, while no consumer has used it
    used: Set[int] = set()
    results: Dict[int, RuleResult] = {}

    def replicated(tid):
        return make_layout(mesh, [()] * len(graph.shape(tid)))

    for i, tid in enumerate(graph.inputs):
        given = input_layouts[i] if i < len(input_layouts) else None
        L[tid] = fit_layout(given, len(graph.shape(tid)), mesh, f"model input {i}") if given is not None \
            else replicated(tid)
        declared.add(tid)
    for name, tid in graph.params.items():
        L[tid] = None
    for tid in graph.consts:
        L[tid] = None
    # declared weights
    for call in graph.calls:
        decl = declarations.get(id(call.cell))
        if decl is None:
            continue
        for attr, layout in decl.weights.items():
            param = getattr(call.cell, attr)
            tid = graph.params.get(getattr(param, "name", None))
            if tid is None:
                raise PlanError(f"{call.path}: weight {attr!r} is not a Parameter of the model")
            fitted = fit_layout(layout, len(graph.shape(tid)), mesh, f"{call.path}.{attr}")
            fitted.check_shape(graph.shape(tid), f"{call.path}.{attr}")
            if tid in declared and L[tid] != fitted:
                raise PlanError(f"weight {graph.tensors[tid].name} is declared twice with different layouts: "
                                f"{L[tid].describe()} and {fitted.describe()}")
            L[tid] = fitted
            declared.add(tid)

    def decide_undecided(tid: int, layout: Layout) -> None:
        """An undecided tensor takes ``layout``; an undecided boundary passes it to its source."""
        L[tid] = layout
        node = graph.producer.get(tid)
        if node is not None and graph.nodes[node].kind in ("enter", "exit"):
            src = graph.nodes[node].inputs[0]
            if L.get(src) is None:
                decide_undecided(src, layout)

    for node in graph.nodes:
        if node.kind in ("enter", "exit"):
            src, dst = node.inputs[0], node.outputs[0]
            decl = declarations.get(id(node.cell))
            layouts = () if decl is None else (decl.inputs if node.kind == "enter" else decl.outputs)
            pos = node.arg if node.kind == "exit" else _tensor_arg_index(graph, node)
            want = layouts[pos] if pos < len(layouts) else None
            if want is not None:
                what = f"{node.kind} of {node.scope or '<model>'} tensor {node.arg}"
                fitted = fit_layout(want, len(graph.shape(dst)), mesh, what)
                fitted.check_shape(graph.shape(dst), what)
                L[dst] = fitted
                declared.add(dst)
                if L.get(src) is None:
                    decide_undecided(src, fitted.without_partial())
            else:
                L[dst] = L.get(src)
                adjustable[dst] = node.index
            continue
        shapes = [graph.shape(t) for t in node.inputs]
        free = [t in adjustable and t not in used and t not in declared for t in node.inputs]
        res = _choose(graph, node, [L.get(t) for t in node.inputs], shapes, free, replicated,
                      [_sibling_layouts(graph, L, t) if f else () for t, f in zip(node.inputs, free)])
        for i, t in enumerate(node.inputs):
            want, have = res.inputs[i], L.get(t)
            if have is None:
                if graph.tensors[t].kind in ("param", "const") and want.partial:
                    raise PlanError(
                        f"{node.describe()} would need {graph.tensors[t].kind} {graph.tensors[t].name} as the "
                        f"partial layout {want.describe()} (added once per partial addend); reduce the partial "
                        f"before this op: declare the output layout of the Cell producing the other operand, "
                        f"or move the op into that Cell")
                decide_undecided(t, want)
            elif have != want:
                if t in adjustable and t not in used and t not in declared:
                    L[t] = want
                else:
                    why = ("it was declared" if t in declared else
                           "another op already used it in that layout" if t in used else
                           "it was produced inside the same construct")
                    raise PlanError(
                        f"{node.describe()} needs input {i} (shape {graph.shape(t)}) as {want.describe()} but "
                        f"it arrives as {have.describe()} and cannot be converted there: {why}. "
                        f"Redistributions run at Cell boundaries: declare the layout in the shard() of the "
                        f"Cell that consumes it (or move the op into a sub-Cell)")
            used.add(t)
        results[node.index] = res
        for t, layout in zip(node.outputs, res.outputs):
            L[t] = layout
    # model outputs: a pending reduction is resolved before the caller sees it
    root_exits = [n for n in graph.calls[0].exit] if graph.calls else []
    for k, n in enumerate(root_exits):
        dst = graph.nodes[n].outputs[0]
        want = output_layouts[k] if k < len(output_layouts) else None
        if want is not None:
            L[dst] = fit_layout(want, len(graph.shape(dst)), mesh, f"model output {k}")
            declared.add(dst)
        elif L[dst] is not None and L[dst].partial:
            L[dst] = L[dst].without_partial()
    for tid, layout in L.items():
        if layout is None:
            L[tid] = replicated(tid)   # unused parameters / constants
    grad_axes_by_tid = _gradient_partials(graph, L, results)
    widened: Dict[int, Set[str]] = {}
    deferred = _hoist(graph, L, declared, grad_axes_by_tid, widened)
    _check_shape_reads(graph, L, results)
    redistributions = _boundary_plans(graph, L, declared, grad_axes_by_tid, deferred, widened)
    params = {name: L[tid] for name, tid in graph.params.items()}
    grad_axes = {name: tuple(sorted(a for a in grad_axes_by_tid.get(tid, ()) if mesh.axis_size(a) > 1))
                 for name, tid in graph.params.items()}
    consts = {tid: L[tid] for tid in graph.consts}
    return ShardingPlan(graph, mesh, L, declared, results, redistributions, params, grad_axes, consts)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _check_shape_reads(graph: Graph, L: Dict[int, Layout], results: Dict[int, RuleResult]) -> None:
    """The parallelized code reads local shapes: a reshape whose target it took from another tensor's shape
    (``s = x.shape[1]`` ... ``q.reshape(b, s, -1, d)``, ``Graph.reshape_reads``) computes its local target
    from that tensor's local shape. Each such target must be the reshape's planned local shape, else the
    code would silently build another shape (or fail far away): a PlanError naming both tensors."""
    for index, (template, reads) in graph.reshape_reads.items():
        node = graph.nodes[index]
        res = results.get(index)
        if res is None:
            continue
        src, dst = node.inputs[0], node.outputs[0]
        planned = res.outputs[0].local_shape(graph.shape(dst))
        local_in = res.inputs[0].local_shape(graph.shape(src))
        code = [L[reads[i][0]].local_shape(graph.shape(reads[i][0]))[reads[i][1]] if i in reads else d
                for i, d in enumerate(template)]
        if -1 in code:          # the code's -1 takes what the local input leaves
            rest = _prod(d for d in code if d != -1)
            n = _prod(local_in)
            code[code.index(-1)] = n // rest if rest and n % rest == 0 else -1
        if tuple(code) == tuple(planned):
            continue
        i = next(i for i, (a, b) in enumerate(zip(code, planned)) if a != b)
        read = reads.get(i) or next(iter(reads.values()))
        tid, dim = read
        raise PlanError(
            f"{node.describe()}: the code reshapes a tensor of global shape {graph.shape(src)} to "
            f"{graph.shape(dst)} with entries read from the shape of tensor {graph.tensors[tid].name or tid} "
            f"(global {graph.shape(tid)}, dim {dim}); this plan gives that tensor the layout "
            f"{L[tid].describe()} (local {L[tid].local_shape(graph.shape(tid))}) and the reshape's output the "
            f"layout {res.outputs[0].describe()} (local {planned}), so the code's local target would be "
            f"{tuple(code)}. Split both alike: declare the layout of the tensor read in the shard() of the Cell "
            f"that reads it, or take the size from the tensor being reshaped")


def strip_unit_axes(layout: Optional[Layout]) -> Optional[Layout]:
    """Mesh axes of size 1 split nothing: drop them so equal layouts compare equal."""
    if layout is None:
        return None
    unit = {a for a in layout.alias_name if layout.axis_size(a) == 1}
    if not unit or not (set(layout.sharded_axes()) | set(layout.partial)) & unit:
        return layout
    return make_layout(layout, [tuple(a for a in axes if a not in unit) for axes in layout.dims],
                       {a: op for a, op in layout.partial.items() if a not in unit})


def _strip_result(res: RuleResult) -> RuleResult:
    res.inputs = tuple(strip_unit_axes(l) for l in res.inputs)
    res.outputs = tuple(strip_unit_axes(l) for l in res.outputs)
    return res


def _sibling_layouts(graph: Graph, L: Dict[int, Optional[Layout]], tid: int) -> Tuple[Layout, ...]:
    """The layouts other boundaries already converted the source of boundary output ``tid`` to (other
    than the source's own): the conversions its sibling consumers pay. E.g. the sequence all-gather a
    wrapped linear's base pays for the input that the wrapper's other sub-Cell (LoRA's A) reads too."""
    node = graph.producer.get(tid)
    if node is None or graph.nodes[node].kind not in ("enter", "exit"):
        return ()
    src = graph.nodes[node].inputs[0]
    out = []
    for c in graph.consumers.get(src, ()):
        other = graph.nodes[c]
        if other.kind in ("enter", "exit") and other.outputs[0] != tid:
            layout = L.get(other.outputs[0])
            if layout is not None and layout != L.get(src) and layout not in out:
                out.append(layout)
    return tuple(out)


def _choose(graph: Graph, node: Node, given: List[Optional[Layout]], shapes, adjustable: List[bool],
            replicated, shared: Sequence[Sequence[Layout]] = ()) -> RuleResult:
    """Apply the node's rule, letting inputs that arrive through a still-adjustable Cell boundary
    change layout: candidates are the layouts as given, the adjustable ones without the mesh axes
    the fixed inputs use, the adjustable ones left to the rule, and each adjustable one as a sibling
    boundary already converted the same source (``shared``, per input). The feasible candidate (fixed
    inputs unchanged) with the fewest conversion bytes wins; a conversion a sibling already pays costs
    nothing (the hoist runs it once for both), and among equal costs the candidate agreeing with the
    siblings wins: siblings that see one layout share one conversion, and the code reading their source's
    shape sees the layout its consumers use."""
    shared = list(shared) + [()] * (len(given) - len(shared))
    if all(g is None for g in given):
        given = [replicated(t) if graph.tensors[t].kind in ("param", "const") else None for t in node.inputs]
        if all(g is None for g in given):
            raise PlanError(f"{node.describe()}: none of its inputs has a layout")
    fixed_axes = set()
    for g, adj in zip(given, adjustable):
        if g is not None and not adj:
            fixed_axes |= _axes_used(g)
    candidates = [list(given)]
    if any(adjustable):
        stripped = []
        for g, adj in zip(given, adjustable):
            if adj and g is not None:
                dims = [tuple(a for a in axes if a not in fixed_axes) for axes in g.dims]
                g = make_layout(g, dims)
            stripped.append(g)
        candidates += [stripped, [None if adj else g for g, adj in zip(given, adjustable)]]
        for i, layouts in enumerate(shared):
            for layout in layouts:
                candidates.append([layout if j == i else g for j, g in enumerate(given)])
    best, best_cost, first_error = None, None, None
    for cand in candidates:
        try:
            res = _strip_result(infer(node.op, cand, shapes, **node.attrs))
        except (ValueError, LookupError) as e:
            first_error = first_error or e
            continue
        cost = disagree = 0
        feasible = True
        for i, t in enumerate(node.inputs):
            have, want = given[i], res.inputs[i]
            if shared[i] and want not in shared[i]:
                disagree += 1
            if have is None or have == want or want in shared[i]:
                continue
            if not adjustable[i]:
                feasible = False
                break
            cost += plan_redistribution(have, want, shapes[i], itemsize(graph.tensors[t].dtype)).bytes_per_rank
        if not feasible and best is not None:
            continue
        key = (not feasible, cost, disagree)
        if best is None or key < best_cost:
            best, best_cost = res, key
    if best is None:
        raise PlanError(f"{node.describe()}: {first_error}") from None
    return best


def _tensor_arg_index(graph: Graph, node: Node) -> int:
    """Position of an enter node among its call's tensor arguments (declarations count tensors)."""
    call = graph.calls[node.call]
    return call.enter.index(node.index)


def _axes_used(layout: Layout) -> Set[str]:
    return set(layout.sharded_axes()) | set(layout.partial)


def _gradient_partials(graph: Graph, L: Dict[int, Layout], results: Dict[int, RuleResult]) -> Dict[int, Set[str]]:
    """Axes over which each float tensor's gradient arrives partial (sum), by a reverse walk."""
    contribs: Dict[int, List[Tuple[Set[str], str]]] = {}
    gp: Dict[int, Set[str]] = {}

    def settle(tid: int) -> Set[str]:
        if tid in gp:
            return gp[tid]
        items = contribs.get(tid, [])
        kinds = {frozenset(c) for c, _ in items}
        if len(kinds) > 1:
            detail = "; ".join(f"{who}: {sorted(c) or 'complete'}" for c, who in items)
            raise PlanError(
                f"the gradient of tensor {graph.tensors[tid].name or tid} (shape {graph.shape(tid)}) would mix "
                f"partial and complete contributions ({detail}); route the partial consumer through a Cell "
                f"boundary (a sub-Cell) so its gradient is reduced there")
        gp[tid] = set(next(iter(kinds))) if kinds else set()
        return gp[tid]

    for node in reversed(graph.nodes):
        if node.kind in ("enter", "exit"):
            kept = _kept_partials(graph, L, node, settle(node.outputs[0]))
            contribs.setdefault(node.inputs[0], []).append((kept, node.describe()))
            continue
        res = results[node.index]
        out_axes: Set[str] = set()
        for t, layout in zip(node.outputs, res.outputs):
            out_axes |= _axes_used(layout) | settle(t)
        for i, t in enumerate(node.inputs):
            if not is_float(graph.tensors[t].dtype):
                continue
            req = res.inputs[i]
            others = set(out_axes)
            for j, r in enumerate(res.inputs):
                if j != i:
                    others |= _axes_used(r)
            contrib = others - set(req.sharded_axes()) - set(req.partial)
            contribs.setdefault(t, []).append((contrib, node.describe()))
    for tid in graph.params.values():
        settle(tid)
    return gp


def _kept_partials(graph: Graph, L: Dict[int, Layout], node: Node, arriving: Set[str]) -> Set[str]:
    """The axes over which a boundary's backward leaves the gradient partial (``arriving``: the axes it
    arrives partial over). Only a parameter passed to a Cell as an argument keeps any: those it is
    replicated on, on both sides (its gradient is then summed with its other contributions once, over its
    ``grad_axes``, as a weight used in place is). Every other boundary reduces the gradient."""
    src, dst = node.inputs[0], node.outputs[0]
    if node.kind != "enter" or graph.tensors[src].kind != "param" or not is_float(graph.tensors[dst].dtype):
        return set()
    S, T = L[src], L[dst]
    return {a for a in arriving
            if a not in T.sharded_axes() and a not in S.sharded_axes() and T.axis_size(a) > 1}


def _hoist(graph: Graph, L: Dict[int, Layout], declared: Set[int], gp: Dict[int, Set[str]],
           widened: Optional[Dict[int, Set[str]]] = None) -> Set[int]:
    """Move a conversion that every consumer of a boundary's output repeats (e.g. the q, k and v
    linears each gathering the sequence and all-reducing their input gradient) up to that
    boundary, so it runs once — Megatron's single conversion before a fused QKV. Returns the
    consumer boundaries that became pass-through.

    The consumers must want one forward layout; their gradients may be partial over different axes
    (a linear whose weight splits its output gives a partial input gradient, a replicated one a complete
    gradient: LoRA's A beside the column-parallel base it adapts). The hoisted backward then takes the
    union of those axes, and a consumer whose gradient is complete over some of them marks it partial
    there (one rank keeps it, the others give zeros: no communication), recorded in ``widened`` (consumer
    boundary node -> the axes), so that the one reduction sums every contribution once. Only where the
    consumers share a forward conversion: a reduction alone is not moved that way."""
    deferred: Set[int] = set()
    widened = {} if widened is None else widened
    changed = True
    while changed:
        changed = False
        for node in reversed(graph.nodes):
            if node.kind not in ("enter", "exit"):
                continue
            t = node.outputs[0]
            users = [graph.nodes[c] for c in graph.consumers.get(t, [])]
            if t in declared or not users or any(u.kind not in ("enter", "exit") or u.index in deferred
                                                 for u in users):
                continue
            targets, partials = set(), {}
            for u in users:
                dst = u.outputs[0]
                T = L[dst]
                partials[u.index] = frozenset(a for a in gp.get(dst, set()) if a not in T.sharded_axes()
                                              and T.axis_size(a) > 1) \
                    if is_float(graph.tensors[dst].dtype) else frozenset()
                targets.add(T)
            if len(targets) != 1:
                continue
            T = targets.pop()
            P = frozenset().union(*partials.values())
            if T.partial or (T == L[t] and not P) or (P and not is_float(graph.tensors[t].dtype)):
                continue
            if T == L[t] and len(set(partials.values())) > 1:
                continue        # widening pays off only where a forward conversion is shared
            L[t] = T
            gp[t] = set(P)
            for u in users:
                if partials[u.index] == P:
                    deferred.add(u.index)
                else:      # its backward marks its gradient partial over the rest of P
                    widened[u.index] = set(P - partials[u.index])
            changed = True
    return deferred


def _boundary_plans(graph: Graph, L: Dict[int, Layout], declared: Set[int],
                    gp: Dict[int, Set[str]], deferred: Set[int] = frozenset(),
                    widened: Optional[Dict[int, Set[str]]] = None) -> List[Redistribution]:
    """``widened`` (``_hoist``): boundary node -> axes over which its backward marks a complete gradient
    partial for the hoisted reduction above it."""
    widened = widened or {}
    out = []
    for node in graph.nodes:
        if node.kind not in ("enter", "exit") or node.index in deferred:
            continue
        src, dst = node.inputs[0], node.outputs[0]
        S, T = L[src], L[dst]
        shape = graph.shape(dst)
        size = itemsize(graph.tensors[dst].dtype)
        grads = is_float(graph.tensors[dst].dtype)
        P = tuple(sorted(a for a in gp.get(dst, set())
                         if a not in T.sharded_axes() and T.axis_size(a) > 1)) if grads else ()
        kept = sorted(_kept_partials(graph, L, node, set(P))) if grads else []   # summed later (grad_axes)
        reduced = [a for a in P if a not in kept]
        wide = sorted(widened.get(node.index, ())) if grads else []
        avg = [a for a, op in S.partial.items() if op == "avg" and T.partial.get(a) != "avg"]
        if S == T and not reduced and not avg and not wide:
            continue
        fwd = plan_redistribution(S, T, shape, size)
        if not fwd.steps and not reduced and not wide and all(S.axis_size(a) == 1 for a in avg):
            continue
        bwd = None
        scale = 1.0
        if grads:
            t_grad = T.without_partial().with_partial(list(P), "sum") if P else T.without_partial()
            left = sorted(set(kept) | set(wide))
            s_grad = S.without_partial().with_partial(left, "sum") if left else S.without_partial()
            bwd = plan_redistribution(t_grad, s_grad, shape, size)
            for a in avg:
                scale /= S.axis_size(a)
        where = f"{node.kind} of {node.scope or '<model>'} tensor {node.arg}"
        out.append(Redistribution(node.index, where, shape, S, T, P, fwd, bwd, scale, dst in declared))
    return out
