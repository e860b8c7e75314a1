"""The op-rule registry: ``register_rule``, ``get_rule``, ``infer`` and the ``RuleResult`` they return.

A rule is a function ``rule(input_layouts, input_shapes, **attrs) -> RuleResult``. It gets one
layout per input (``None`` = not decided yet: the rule picks the layout it wants) and the global
shapes, and returns the output layouts (possibly partial) and the layouts the op *requires* of
its inputs. Running the op on every rank's local shards of the required layouts gives the local
shards of the output layouts. Pure Python.

Where the local computation differs (``RuleResult.local``, e.g. a vocab-parallel lookup), the rule's
module also registers how ``parallelize`` builds that kernel: ``@register_local_kernel(name)`` on a
factory ``(KernelSite) -> Cell``, looked up with ``local_kernel(name)``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..layout import Layout, as_layout

Shape = Tuple[int, ...]


class RuleError(ValueError):
    """An op cannot be sharded as asked (bad shapes, attributes or layouts)."""


class NoRuleError(LookupError):
    """No rule is registered for the op."""


@dataclass
class LocalKernel:
    """How a rank's local computation differs from "the same op, same attributes, on the local
    shards": another kernel (e.g. vocab-parallel embedding) or attributes in local terms."""
    name: str
    attrs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RuleResult:
    outputs: Tuple[Layout, ...]
    inputs: Tuple[Layout, ...]                 # required input layouts
    local: Optional[LocalKernel] = None        # None: run the op unchanged on local shards
    op: str = ""
    given: Tuple[Optional[Layout], ...] = ()   # the layouts the rule was asked about

    @property
    def output(self) -> Layout:
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op}: has {len(self.outputs)} outputs; use .outputs")
        return self.outputs[0]

    def redistributions(self) -> List[Tuple[int, Layout, Layout]]:
        """``(input index, given, required)`` for every decided input whose layout must change."""
        return [(i, g, r) for i, (g, r) in enumerate(zip(self.given, self.inputs))
                if g is not None and g != r]

    def describe(self) -> str:
        ins = ", ".join(r.describe() for r in self.inputs)
        outs = ", ".join(o.describe() for o in self.outputs)
        text = f"{self.op}: {ins} -> {outs}"
        if self.local is not None:
            text += f" [local kernel {self.local.name}]"
        for i, g, r in self.redistributions():
            text += f"\n  input {i}: redistribute {g.describe()} -> {r.describe()}"
        for i, (g, r) in enumerate(zip(self.given, self.inputs)):
            if g is None:
                text += f"\n  input {i}: undecided, takes {r.describe()}"
        return text


Rule = Callable[..., RuleResult]
_RULES: Dict[str, Rule] = {}
_NAMES: Dict[str, str] = {}


# ---- local kernels: what ``parallelize`` runs for a ``RuleResult.local`` name -----------------------------
class KernelError(ValueError):
    """A local kernel cannot be built for this op (``parallelize`` names the op in the PlanError)."""


@dataclass(frozen=True)
class KernelSite:
    """Where a local kernel replaces an atomic Cell: the traced ``node``, its rule ``result``
    (``result.local`` names the kernel and holds its attributes), the ``cell`` replaced, this
    ``rank`` and the traced ``graph`` (global shapes)."""
    node: Any
    result: RuleResult
    cell: Any
    rank: int
    graph: Any

    @property
    def attrs(self) -> Dict[str, Any]:
        return self.result.local.attrs

    def input_shape(self, i: int) -> Shape:
        return tuple(self.graph.shape(self.node.inputs[i]))


KernelFactory = Callable[[KernelSite], Any]   # -> the kernel Cell (keeps the replaced Cell as ``inner``)


@dataclass(frozen=True)
class LocalKernelEntry:
    """How ``parallelize`` executes the local kernel ``name``: ``factory(site)`` builds the Cell replacing
    an atomic Cell (one with a ``sharding_op``); ``shape_from_input``: no kernel, the same op with the
    local shape, correct when the model computes the target shape from its input's shape
    (``x.reshape(b, s, -1, head_dim)`` with ``b, s = x.shape``), so it also runs in plain model code."""
    name: str
    factory: Optional[KernelFactory] = None
    shape_from_input: bool = False


_KERNELS: Dict[str, LocalKernelEntry] = {}


def _register_kernel(entry: LocalKernelEntry) -> None:
    known = _KERNELS.get(entry.name)
    if known is not None and known != entry:
        raise ValueError(f"register_local_kernel: local kernel {entry.name!r} is already registered ({known})")
    _KERNELS[entry.name] = entry


def register_local_kernel(name: str) -> Callable[[KernelFactory], KernelFactory]:
    """Decorator registering ``factory(site) -> kernel Cell`` for the local kernel ``name`` (what a rule
    puts in ``RuleResult.local``), next to the rule that selects it. A factory imports its kernel
    class when called (kernels need MindSpore; rules stay pure Python) and raises ``KernelError``
    for an op it cannot run."""
    def deco(factory: KernelFactory) -> KernelFactory:
        _register_kernel(LocalKernelEntry(name, factory))
        return factory
    return deco


def register_shape_from_input(*names: str) -> None:
    """Local kernels that are the same op with the local shape (``LocalKernelEntry.shape_from_input``)."""
    for name in names:
        _register_kernel(LocalKernelEntry(name, shape_from_input=True))


def local_kernel(name: str) -> Optional[LocalKernelEntry]:
    """The registered local kernel ``name``; None when no module registered it (not implemented)."""
    return _KERNELS.get(name)


def registered_local_kernels() -> List[str]:
    return sorted(_KERNELS)


def _key(op_name: str) -> str:
    """``BatchMatMul``, ``batch_matmul`` and ``batchmatmul`` name the same op."""
    return op_name.replace("_", "").lower()


def register_rule(*op_names: str) -> Callable[[Rule], Rule]:
    """Decorator registering a rule under one or more op names (case and ``_`` ignored)."""
    def deco(rule: Rule) -> Rule:
        for name in op_names:
            key = _key(name)
            if key in _RULES and _RULES[key] is not rule:
                raise ValueError(f"register_rule: op {name!r} already has a rule "
                                 f"({_RULES[key].__module__}.{_RULES[key].__name__})")
            _RULES[key], _NAMES[key] = rule, name
        return rule
    return deco


def registered_ops() -> List[str]:
    return sorted(_NAMES.values())


def get_rule(op_name: str, inputs: str = "") -> Rule:
    """The rule for ``op_name``; :class:`NoRuleError` if there is none (``inputs`` goes in the message)."""
    rule = _RULES.get(_key(op_name))
    if rule is None:
        where = f" ({inputs})" if inputs else ""
        raise NoRuleError(f"no sharding rule for op {op_name!r}{where}; add one with "
                          f"@register_rule({op_name!r}) (see docs/sharding.md)")
    return rule


def describe_inputs(layouts: Sequence[Optional[Layout]], shapes: Sequence[Shape]) -> str:
    return "; ".join(f"input {i}: {'undecided' if l is None else l.describe()} shape {tuple(s)}"
                     for i, (l, s) in enumerate(zip(layouts, shapes)))


def infer(op_name: str, input_layouts: Sequence[Optional[Layout]], input_shapes: Sequence[Sequence[int]],
          **attrs) -> RuleResult:
    """Apply ``op_name``'s rule. Raises :class:`NoRuleError` for an op without a rule and
    :class:`RuleError` (naming the op, the inputs and the offending dim) for bad input."""
    layouts = tuple(None if l is None else as_layout(l) for l in input_layouts)
    shapes = tuple(tuple(int(d) for d in s) for s in input_shapes)
    where = describe_inputs(layouts, shapes)
    rule = get_rule(op_name, where)
    if len(layouts) != len(shapes):
        raise RuleError(f"{op_name}: {len(layouts)} input layouts but {len(shapes)} input shapes")
    decided = [l for l in layouts if l is not None]
    for l in decided[1:]:
        if (l.device_matrix, l.alias_name, l.rank_list) != (decided[0].device_matrix,
                                                           decided[0].alias_name, decided[0].rank_list):
            raise RuleError(f"{op_name}: inputs live on different device meshes ({where}): {decided[0]!r} "
                            f"vs {l!r}; redistribute them to one mesh first")
    for i, (l, s) in enumerate(zip(layouts, shapes)):
        if l is not None:
            try:
                l.check_shape(s, f"{op_name}: input {i}")
            except ValueError as e:
                raise RuleError(str(e)) from None
    try:
        inspect.signature(rule).bind(layouts, shapes, **attrs)
    except TypeError as e:
        params = list(inspect.signature(rule).parameters)[2:]
        raise RuleError(f"{op_name}: {e}; valid attributes: {params}") from None
    try:
        result = rule(layouts, shapes, **attrs)
    except RuleError as e:
        raise RuleError(f"{op_name} ({where}): {e}") from None
    if len(result.inputs) != len(layouts):
        raise AssertionError(f"rule for {op_name} returned {len(result.inputs)} input layouts "
                             f"for {len(layouts)} inputs")
    result.op, result.given = op_name, layouts
    return result
