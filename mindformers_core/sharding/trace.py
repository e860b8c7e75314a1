"""Record what a model's forward does, once, in PyNative, so propagation can reason about it.

MindSpore has no operator-dispatch hook, so the tracer patches, for the duration of one forward:

* ``nn.Cell.__call__``: every Cell call becomes a scope with *boundary* nodes for its tensor
  inputs and outputs (the only places a redistribution can later run, see ``boundary.py``). A
  Cell with a ``sharding_op`` attribute is *atomic*: recorded as one op with that rule, inputs =
  its tensor arguments then the attributes named in ``sharding_params``;
* a table of functional ops and Tensor methods/operators (``TRACED_OPS``), recorded with their
  rule name and attributes.

Tensors are identified by object identity; every tensor consumed must have a known origin (a
model input, a Parameter, a constant Tensor attribute of a Cell, or a recorded op). An op that is
not in the table produces a tensor of unknown origin, and its first consumer raises
:class:`TraceError` naming both — the tracer never guesses.

Shapes read by the model code: while tracing, ``Tensor.shape`` of a known tensor gives :class:`ShapeDim`
ints that remember the tensor and the dim they came from. A reshape whose target holds one records it
(``Graph.reshape_reads``): the parallelized code reads that tensor's *local* shape at run time, so the pass
checks that the layouts it chose make the code's local target the reshape's planned local shape
(``propagation._check_shape_reads``; e.g. ``s = x.shape[1]`` then ``q.reshape(b, s, -1, d)`` needs x and q
split alike along the sequence).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


class TraceError(RuntimeError):
    """The forward did something the tracer cannot follow."""


@dataclass
class TensorInfo:
    tid: int
    shape: Tuple[int, ...]
    dtype: str
    kind: str            # "input" | "param" | "const" | "op" | "boundary"
    name: str = ""       # parameter name, constant path, or producing node


@dataclass
class Node:
    index: int
    kind: str                       # "op" | "enter" | "exit"
    op: str                         # rule name; "enter"/"exit" for boundaries
    inputs: List[int]
    outputs: List[int]
    scope: str                      # qualified name of the Cell whose construct ran it
    attrs: Dict[str, Any] = field(default_factory=dict)
    cell: Any = None                # enter/exit/atomic: the Cell object
    call: int = -1                  # enter/exit/atomic: index of the Cell call
    arg: int = -1                   # enter/exit: which tensor argument / output

    def describe(self) -> str:
        if self.kind == "op":
            return f"{self.op} in {self.scope or '<model>'}"
        return f"{self.kind} of {self.scope or '<model>'} (tensor {self.arg})"


@dataclass
class CellCall:
    index: int
    cell: Any
    path: str
    atomic: bool
    enter: List[int] = field(default_factory=list)   # node indices
    exit: List[int] = field(default_factory=list)
    node: int = -1                                   # atomic op node


class ShapeDim(int):
    """An int read from ``Tensor.shape`` of a traced tensor: ``source`` = (tensor id, dim). Arithmetic on it
    gives a plain int (only a dim passed on as it is stays known)."""

    def __new__(cls, value: int, tid: int, dim: int):
        obj = int.__new__(cls, value)
        obj.source = (tid, dim)
        return obj


@dataclass
class Graph:
    tensors: Dict[int, TensorInfo] = field(default_factory=dict)
    nodes: List[Node] = field(default_factory=list)
    calls: List[CellCall] = field(default_factory=list)
    inputs: List[int] = field(default_factory=list)
    outputs: List[int] = field(default_factory=list)
    params: Dict[str, int] = field(default_factory=dict)         # parameter name -> tid
    consts: Dict[int, Tuple[Any, str]] = field(default_factory=dict)  # tid -> (owner cell, attr)
    producer: Dict[int, int] = field(default_factory=dict)       # tid -> node index
    consumers: Dict[int, List[int]] = field(default_factory=dict)
    # reshape node index -> (its target as the code wrote it (-1 kept), {position: (tensor id, dim) the code
    # read that entry from}); only reshapes whose target holds a ShapeDim
    reshape_reads: Dict[int, Tuple[Tuple[int, ...], Dict[int, Tuple[int, int]]]] = field(default_factory=dict)

    def shape(self, tid: int) -> Tuple[int, ...]:
        return self.tensors[tid].shape

    def add_node(self, node: Node) -> Node:
        self.nodes.append(node)
        for t in node.outputs:
            self.producer[t] = node.index
        for t in node.inputs:
            self.consumers.setdefault(t, []).append(node.index)
        return node


# ----------------------------------------------------------------------------- op table

def _binary(rule_tensor: str, rule_scalar: str, swap: bool = False):
    """``a op b`` where either side may be a Python scalar. Adding a scalar is not linear (it
    must not be added once per partial addend), scaling by one is."""
    def spec(args, kwargs):
        a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
        if swap:
            a, b = b, a
        ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
        if ta and tb:
            return rule_tensor, [a, b], {}
        return rule_scalar, [a if ta else b], {"scalar": b if ta else a, "scalar_first": tb}
    return spec


def _unary(rule: str, **fixed):
    def spec(args, kwargs):
        return rule, [args[0]], dict(fixed)
    return spec


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _axis_spec(rule: str, *names: str, keep_names=("keep_dims", "keepdim", "keepdims"), pos_keep=2):
    def spec(args, kwargs):
        axis = None
        if len(args) > 1:
            axis = args[1]
        for n in names:
            if n in kwargs:
                axis = kwargs[n]
        keep = bool(args[pos_keep]) if len(args) > pos_keep and isinstance(args[pos_keep], bool) else False
        for n in keep_names:
            if n in kwargs:
                keep = bool(kwargs[n])
        if isinstance(axis, list):
            axis = tuple(axis)
        return rule, [args[0]], {"axis": axis, "keep_dims": keep}
    return spec


def _softmax(rule):
    def spec(args, kwargs):
        return rule, [args[0]], {"axis": _arg(args, kwargs, 1, "axis", kwargs.get("dim", -1))}
    return spec


def _perm_from(args, kwargs, ndim):
    perm = _arg(args, kwargs, 1, "input_perm", kwargs.get("perm", kwargs.get("dims")))
    if perm is None and len(args) > 2:
        perm = args[1:]
    return tuple(int(p) % ndim for p in perm)


def _transpose(args, kwargs):
    x = args[0]
    rest = args[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        rest = tuple(rest[0])
    perm = tuple(int(p) % x.ndim for p in (rest or kwargs.get("input_perm") or kwargs.get("perm")
                                            or kwargs.get("dims")))
    return "transpose", [x], {"perm": perm}


def _swapaxes(args, kwargs):
    x = args[0]
    a, b = (int(v) % x.ndim for v in (_arg(args, kwargs, 1, "axis0"), _arg(args, kwargs, 2, "axis1")))
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return "transpose", [x], {"perm": tuple(perm)}


def _reshape(args, kwargs):
    target = args[1:] if len(args) > 1 else (kwargs.get("shape"),)
    if len(target) == 1 and isinstance(target[0], (tuple, list)):
        target = tuple(target[0])
    return "reshape", [args[0]], {"target": tuple(target)}   # the planned shape: filled from the output


def _cast(args, kwargs):
    return "cast", [args[0]], {"dtype": str(_arg(args, kwargs, 1, "dtype"))}


def _repeat_interleave(args, kwargs):
    return "repeat_interleave", [args[0]], {"repeats": _arg(args, kwargs, 1, "repeats"),
                                            "axis": _arg(args, kwargs, 2, "axis", kwargs.get("dim"))}


def _expand_dims(args, kwargs):
    return "expand_dims", [args[0]], {"axis": _arg(args, kwargs, 1, "axis", kwargs.get("dim"))}


def _squeeze(args, kwargs):
    axis = _arg(args, kwargs, 1, "axis", kwargs.get("dim"))
    return "squeeze", [args[0]], {"axis": tuple(axis) if isinstance(axis, list) else axis}


def _gather(args, kwargs):
    return "gather", [args[0], args[1]], {"axis": _arg(args, kwargs, 2, "axis", 0)}


def _concat(args, kwargs):
    return "concat", list(args[0]), {"axis": _arg(args, kwargs, 1, "axis", kwargs.get("dim", 0))}


def _split(rule):
    def spec(args, kwargs):
        return "split", [args[0]], {"axis": _arg(args, kwargs, 2, "axis", kwargs.get("dim", 0))}
    return spec


def _dropout(args, kwargs):
    return "dropout", [args[0]], {"p": _arg(args, kwargs, 1, "p", 0.5)}


# (owner, attribute, spec). Owners are patched only while a trace runs.
TRACED_OPS: List[Tuple[Any, str, Callable]] = [
    (ops, "matmul", lambda a, k: ("matmul", [a[0], a[1]], {})),
    (ops, "bmm", lambda a, k: ("matmul", [a[0], a[1]], {})),
    (ops, "add", _binary("add", "add_scalar")),
    (ops, "sub", _binary("sub", "add_scalar")),
    (ops, "mul", _binary("mul", "scale")),
    (ops, "div", _binary("div", "scale")),
    (ops, "transpose", _transpose),
    (ops, "permute", _transpose),
    (ops, "swapaxes", _swapaxes),
    (ops, "reshape", _reshape),
    (ops, "softmax", _softmax("softmax")),
    (ops, "log_softmax", _softmax("log_softmax")),
    (ops, "cast", _cast),
    (ops, "repeat_interleave", _repeat_interleave),
    (ops, "expand_dims", _expand_dims),
    (ops, "unsqueeze", _expand_dims),
    (ops, "squeeze", _squeeze),
    (ops, "gather", _gather),
    (ops, "concat", _concat),
    (ops, "cat", _concat),
    (ops, "split", _split("split")),
    (ops, "chunk", _split("chunk")),
    (ops, "mean", _axis_spec("mean", "axis", "dim")),
    (ops, "sum", _axis_spec("sum", "axis", "dim")),
    (ops, "amax", _axis_spec("max", "axis", "dim")),
    (ops, "dropout", _dropout),
] + [(ops, name, _unary(name)) for name in (
    "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "square", "neg", "abs",
    "erf", "sin", "cos")] + [
    (Tensor, "__add__", _binary("add", "add_scalar")),
    (Tensor, "__radd__", _binary("add", "add_scalar", swap=True)),
    (Tensor, "__sub__", _binary("sub", "add_scalar")),
    (Tensor, "__rsub__", _binary("sub", "add_scalar", swap=True)),
    (Tensor, "__mul__", _binary("mul", "scale")),
    (Tensor, "__rmul__", _binary("mul", "scale", swap=True)),
    (Tensor, "__truediv__", _binary("div", "scale")),
    (Tensor, "__rtruediv__", _binary("div", "reciprocal_scale", swap=True)),
    (Tensor, "__matmul__", lambda a, k: ("matmul", [a[0], a[1]], {})),
    (Tensor, "__neg__", _unary("neg")),
    (Tensor, "reshape", _reshape),
    (Tensor, "view", _reshape),
    (Tensor, "transpose", _transpose),
    (Tensor, "permute", _transpose),
    (Tensor, "swapaxes", _swapaxes),
    (Tensor, "astype", _cast),
    (Tensor, "mean", _axis_spec("mean", "axis", "dim")),
    (Tensor, "sum", _axis_spec("sum", "axis", "dim")),
    (Tensor, "expand_dims", _expand_dims),
    (Tensor, "unsqueeze", _expand_dims),
    (Tensor, "squeeze", _squeeze),
]


def _dense_activation(cell) -> Optional[str]:
    """``nn.Dense(activation=...)`` applies it inside the Cell, after the bias: the rule must know,
    since an activation of partial sums is not the activation of their sum."""
    act = getattr(cell, "activation", None) if getattr(cell, "activation_flag", False) else None
    return None if act is None else type(act).__name__


# MindSpore's own Cells treated as atomic ops: class -> (rule, parameter attributes, rule attrs);
# an attribute given as a function is computed from the Cell.
ATOMIC_CELLS: Dict[type, Tuple[str, Tuple[str, ...], Dict[str, Any]]] = {
    nn.Dense: ("linear", ("weight", "bias"), {"transpose_b": True, "activation": _dense_activation}),
    nn.ReLU: ("relu", (), {}),
    nn.GELU: ("gelu", (), {}),
    nn.SiLU: ("silu", (), {}),
    nn.Tanh: ("tanh", (), {}),
    nn.Sigmoid: ("sigmoid", (), {}),
}


def atomic_spec(cell) -> Optional[Tuple[str, Tuple[str, ...], Dict[str, Any]]]:
    """``(rule, parameter attributes, attrs)`` if ``cell`` is recorded as one op, else None."""
    if hasattr(type(cell), "sharding_op"):
        attrs = dict(cell.sharding_attrs()) if hasattr(cell, "sharding_attrs") else {}
        return type(cell).sharding_op, tuple(getattr(cell, "sharding_params", ())), attrs
    for klass in type(cell).__mro__:
        if klass in ATOMIC_CELLS:
            rule, params, attrs = ATOMIC_CELLS[klass]
            return rule, params, {k: v(cell) if callable(v) else v for k, v in attrs.items()}
    return None


def traced_op_names() -> List[str]:
    return sorted({f"{'Tensor.' if owner is Tensor else 'ops.'}{name}" for owner, name, _ in TRACED_OPS})


# ----------------------------------------------------------------------------- tracer

def _flat(obj) -> List[Any]:
    if isinstance(obj, (tuple, list)):
        return [x for o in obj for x in _flat(o)]
    return [obj]


def _dtype(t) -> str:
    return str(t.dtype)


def _shape(t) -> Tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


_ACTIVE = threading.local()


class _Tracer:
    def __init__(self, model: nn.Cell):
        self.model = model
        self.g = Graph()
        self.frames: List[Dict[int, int]] = [{}]
        self.keep: List[Any] = []          # keep traced objects alive: ids must not be reused
        self.scopes: List[str] = []
        self.depth = 0                     # > 0 inside a recorded op or atomic cell: do not record
        self.cell_paths = {id(c): n for n, c in model.cells_and_names()}
        self._next = 0

    # tensors
    def new_tensor(self, obj, kind: str, name: str = "") -> int:
        tid = self._next
        self._next += 1
        self.g.tensors[tid] = TensorInfo(tid, _shape(obj), _dtype(obj), kind, name)
        self.keep.append(obj)
        return tid

    def bind(self, obj, tid: int) -> None:
        self.frames[-1][id(obj)] = tid

    def lookup(self, obj, consumer: str) -> int:
        tid = self.known(obj)
        if tid is not None:
            return tid
        raise TraceError(
            f"{consumer} consumes a tensor of shape {_shape(obj)} whose origin the tracer does not "
            f"know: it was made by an operation outside the traced table, or created inside "
            f"construct. Traced ops: {', '.join(traced_op_names())}. Precompute constants in "
            f"__init__ as Tensor attributes, or wrap the computation in a Cell with a `sharding_op` "
            f"(see docs/sharding.md)")

    def scope(self) -> str:
        return self.scopes[-1] if self.scopes else ""

    def register_outputs(self, outs, rule: str, index: int) -> List[int]:
        """New tensor ids for an op's outputs, bound in the current scope."""
        tids = []
        for o in outs:
            tid = self.new_tensor(o, "op", f"{rule}#{index}")
            self.bind(o, tid)
            tids.append(tid)
        return tids

    # recording
    def record_op(self, rule: str, inputs: Sequence[Any], attrs: Dict[str, Any], out) -> None:
        where = f"op {rule!r} in {self.scope() or '<model>'}"
        in_tids = [self.lookup(t, where) for t in inputs]
        outs = [o for o in _flat(out) if isinstance(o, Tensor)]
        reads = None
        if rule == "reshape":
            target = attrs.get("target", ())
            reads = {i: d.source for i, d in enumerate(target) if isinstance(d, ShapeDim)}
            try:
                template = tuple(int(d) for d in target)
            except (TypeError, ValueError):
                template = ()
            attrs = {"shape": _shape(outs[0])}
        if rule == "split":
            attrs = {"axis": attrs["axis"], "sizes": tuple(_shape(o)[attrs["axis"] % len(_shape(o))]
                                                           for o in outs)}
        index = len(self.g.nodes)
        self.g.add_node(Node(index, "op", rule, in_tids, self.register_outputs(outs, rule, index), self.scope(),
                             attrs))
        if reads and len(template) == len(attrs["shape"]):
            self.g.reshape_reads[index] = (template, reads)

    def known(self, obj) -> Optional[int]:
        """The tensor id of ``obj`` if the trace knows it (no error otherwise)."""
        for frame in reversed(self.frames):
            tid = frame.get(id(obj))
            if tid is not None:
                return tid
        return None

    def call_cell(self, cell, orig_call, args, kwargs):
        path = self.cell_paths.get(id(cell))
        if path is None:
            raise TraceError(f"a Cell of type {type(cell).__name__} that is not a sub-Cell of the model "
                             f"was called during tracing; register it as an attribute of the model")
        if kwargs:
            raise TraceError(f"Cell {path or '<model>'} was called with keyword arguments "
                             f"{sorted(kwargs)}; pass tensors positionally so layouts can follow them")
        spec = atomic_spec(cell)
        call = CellCall(len(self.g.calls), cell, path, atomic=spec is not None)
        self.g.calls.append(call)
        tensor_args = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
        outer = [self.lookup(a, f"Cell {path or '<model>'}") for _, a in tensor_args]
        self.frames.append({})
        self.scopes.append(path)
        inner = []
        for (i, a), src in zip(tensor_args, outer):
            tid = self.new_tensor(a, "boundary", f"enter {path}")
            node = self.g.add_node(Node(len(self.g.nodes), "enter", "enter", [src], [tid], path,
                                        cell=cell, call=call.index, arg=i))
            call.enter.append(node.index)
            self.bind(a, tid)
            inner.append(tid)
        try:
            if call.atomic:
                params = []
                rule, param_names, attrs = spec
                for name in param_names:
                    value = getattr(cell, name, None)
                    if value is not None:
                        params.append(self.lookup(value, f"atomic Cell {path} parameter {name!r}"))
                self.depth += 1
                try:
                    out = orig_call(cell, *args)
                finally:
                    self.depth -= 1
                outs = [o for o in _flat(out) if isinstance(o, Tensor)]
                index = len(self.g.nodes)
                self.g.add_node(Node(index, "op", rule, inner + params, self.register_outputs(outs, rule, index),
                                     path, attrs, cell=cell, call=call.index))
                call.node = index
            else:
                out = orig_call(cell, *args)
            inner_out = [(o, self.lookup(o, f"output of Cell {path or '<model>'}"))
                         for o in _flat(out) if isinstance(o, Tensor)]
        finally:
            self.frames.pop()
            self.scopes.pop()
        for k, (o, src) in enumerate(inner_out):
            tid = self.new_tensor(o, "boundary", f"exit {path}")
            node = self.g.add_node(Node(len(self.g.nodes), "exit", "exit", [src], [tid], path,
                                        cell=cell, call=call.index, arg=k))
            call.exit.append(node.index)
            self.bind(o, tid)
        return out


def _make_op_wrapper(orig, spec):
    def wrapper(*args, **kwargs):
        tracer = getattr(_ACTIVE, "tracer", None)
        if tracer is None or tracer.depth:
            return orig(*args, **kwargs)
        tracer.depth += 1
        try:
            out = orig(*args, **kwargs)
        finally:
            tracer.depth -= 1
        rule, inputs, attrs = spec(args, kwargs)
        tracer.record_op(rule, inputs, attrs, out)
        return out
    return wrapper


def trace(model: nn.Cell, *inputs) -> Graph:
    """Run ``model(*inputs)`` once in PyNative (global shapes, full weights) and return its
    :class:`Graph`. Inputs may be Tensors, NumPy arrays, or ``(shape, dtype)`` specs (zeros)."""
    import numpy as np
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise TraceError("tracing needs PyNative mode (ms.set_context(mode=ms.PYNATIVE_MODE)); the "
                         "parallelized model then runs in either mode")
    if getattr(_ACTIVE, "tracer", None) is not None:
        raise TraceError("a trace is already running")
    real = []
    for x in inputs:
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], (tuple, list)):
            shape, dtype = x
            npdtype = np.dtype(dtype) if isinstance(dtype, (str, type)) else ms.dtype_to_nptype(dtype)
            real.append(Tensor(np.zeros(tuple(shape), dtype=npdtype)))
        elif isinstance(x, np.ndarray):
            real.append(Tensor(x))
        else:
            real.append(x)
    tracer = _Tracer(model)
    g = tracer.g
    for name, p in model.parameters_and_names():
        tid = tracer.new_tensor(p, "param", p.name)
        tracer.bind(p, tid)
        g.params[p.name] = tid
    for path, cell in model.cells_and_names():
        for attr, value in vars(cell).items():
            if isinstance(value, Tensor) and not isinstance(value, Parameter):
                tid = tracer.new_tensor(value, "const", f"{path + '.' if path else ''}{attr}")
                tracer.bind(value, tid)
                g.consts[tid] = (cell, attr)
    for x in real:
        if isinstance(x, Tensor):
            tid = tracer.new_tensor(x, "input", f"input {len(g.inputs)}")
            tracer.bind(x, tid)
            g.inputs.append(tid)
    saved = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name, _ in TRACED_OPS]
    orig_call = nn.Cell.__call__
    orig_shape = vars(Tensor)["shape"]

    def traced_shape(t):
        shape = orig_shape.fget(t)
        if tracer.depth:                   # read inside a recorded op: MindSpore's own code
            return shape
        tid = tracer.known(t)
        return shape if tid is None else tuple(ShapeDim(int(d), tid, i) for i, d in enumerate(shape))

    def cell_call(cell, *args, **kwargs):
        if tracer.depth:
            return orig_call(cell, *args, **kwargs)
        return tracer.call_cell(cell, orig_call, args, kwargs)

    _ACTIVE.tracer = tracer
    try:
        for (owner, name, spec), (_, _, orig, _) in zip(TRACED_OPS, saved):
            setattr(owner, name, _make_op_wrapper(orig, spec))
        nn.Cell.__call__ = cell_call
        Tensor.shape = property(traced_shape)
        out = model(*real)
        g.outputs = [tracer.lookup(o, "model output") for o in _flat(out) if isinstance(o, Tensor)]
    finally:
        Tensor.shape = orig_shape
        nn.Cell.__call__ = orig_call
        for owner, name, orig, own in saved:
            if own:
                setattr(owner, name, orig)
            else:
                delattr(owner, name)
        _ACTIVE.tracer = None
    return g

