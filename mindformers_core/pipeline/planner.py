"""Stage planner: measure each transformer layer, then split the layers over pipeline stages so
that the slowest stage is as fast as possible, under a per-stage memory limit.

(In the spirit of RoundPipe's ``ModelExecutePlan.auto``.) Three parts:

* ``measure_layers(model_or_layers, sample_input)`` times every layer Cell's forward and backward
  on its real input (the previous layer's output), averaged over ``steps`` runs after a warm-up,
  and counts its parameter bytes; for a ``GPTModel`` also the embedding and the head (final norm,
  output layer, loss). The backward is timed as the pipeline runtime runs it: a gradient function
  with a sensitivity, which recomputes the forward, so ``bwd`` is what a ``BWD`` step costs.
* ``plan_stages(layer_costs, num_stages, memory_limit_bytes=None, embedding_cost=None,
  head_cost=None)`` gives each stage one run of consecutive layers (stage 0 also the embedding, the
  last stage the head), minimising the largest stage time ``sum(fwd + bwd)`` exactly (dynamic
  programming over split points, O(stages x layers^2)); among the splits with that bottleneck it
  takes the most even one (least sum of squared stage times). Pure Python.
* ``report(plan, measured_stage_times)`` prints predicted against measured stage times;
  ``measure_stage_times`` measures them on the stage models the plan builds.

The trainer's ``layers_per_stage: auto`` (``training.stage_planning.auto_stage_plan``) does all of
it for a YAML config; this module knows no model class and no config file. Stage times here are per microbatch; with virtual
stages (``pipeline_interleave > 1``) the stages are planned in model order, each on its own.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..common.placement import format_layer_ranges

PLAN_FILE = "stage_plan.json"


@dataclass(frozen=True)
class LayerCost:
    """Measured (or estimated) cost of one layer for one microbatch: ``fwd`` and ``bwd`` seconds
    (any consistent unit works), ``param_bytes`` of its weights and ``act_bytes`` of anything else
    it keeps on its stage (activations, optimizer state: add what your memory model needs)."""
    fwd: float
    bwd: float = 0.0
    param_bytes: int = 0
    act_bytes: int = 0

    @property
    def time(self) -> float:
        return self.fwd + self.bwd

    @property
    def memory(self) -> int:
        return self.param_bytes + self.act_bytes


@dataclass(frozen=True)
class LayerProfile:
    """What ``measure_layers`` returns: ``layers[i]`` for decoder layer i, and the embedding and
    head costs when the model has them (else None)."""
    layers: List[LayerCost]
    embedding: Optional[LayerCost] = None
    head: Optional[LayerCost] = None
    steps: int = 0
    mode: str = "pynative"


CostLike = Union[LayerCost, float, int]


def _as_cost(value: Any, what: str) -> LayerCost:
    if isinstance(value, LayerCost):
        cost = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        cost = LayerCost(float(value))
    else:
        raise TypeError(f"plan_stages: {what}={value!r} must be a LayerCost or a number (its time)")
    for name in ("fwd", "bwd"):
        v = getattr(cost, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"plan_stages: {what}.{name}={v!r} must be a finite number >= 0")
    for name in ("param_bytes", "act_bytes"):
        v = getattr(cost, name)
        if not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"plan_stages: {what}.{name}={v!r} must be a number >= 0")
    return cost


def _mb(n: float) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB" if n >= 2**10 else f"{n:g} B"


@dataclass
class StagePlan:
    """A split of ``num_layers`` layers over ``len(stages)`` stages in model order.

    ``stages[s]`` is the ``range`` of global layer indices of stage s; ``stage_times[s]`` the
    predicted time of one microbatch's forward + backward on it (embedding/head included),
    ``stage_fwd`` / ``stage_bwd`` its two parts, ``stage_memory[s]`` its bytes."""
    stages: List[range]
    stage_times: List[float]
    stage_fwd: List[float]
    stage_bwd: List[float]
    stage_memory: List[int]
    memory_limit_bytes: Optional[int] = None
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        return sum(len(r) for r in self.stages)

    @property
    def bottleneck(self) -> float:
        """The largest predicted stage time: what bounds the pipeline's throughput."""
        return max(self.stage_times)

    @property
    def counts(self) -> List[int]:
        """Layers per stage, e.g. ``[3, 5, 5, 3]`` (accepted as ``layers_per_stage``)."""
        return [len(r) for r in self.stages]

    def to_layer_ranges(self) -> List[str]:
        """One layer-range string per stage, e.g. ``["0-2", "3-7", "8-12", "13-15"]`` (accepted by
        ``common.placement.stage_layer_ranges`` as ``layers_per_stage``)."""
        return [format_layer_ranges(list(r)) for r in self.stages]

    def to_offsets(self) -> List[int]:
        """MindFormers ``model_config.offset`` form: stage s holds
        ``num_layers // num_stages + offset[s]`` layers."""
        base = self.num_layers // self.num_stages
        return [c - base for c in self.counts]

    def to_dict(self) -> Dict[str, Any]:
        return {"counts": self.counts, "stage_times": self.stage_times, "stage_fwd": self.stage_fwd,
                "stage_bwd": self.stage_bwd, "stage_memory": self.stage_memory,
                "memory_limit_bytes": self.memory_limit_bytes, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "StagePlan":
        starts = [sum(data["counts"][:s]) for s in range(len(data["counts"]))]
        return cls([range(a, a + c) for a, c in zip(starts, data["counts"])], list(data["stage_times"]),
                   list(data["stage_fwd"]), list(data["stage_bwd"]), list(data["stage_memory"]),
                   data.get("memory_limit_bytes"), dict(data.get("meta") or {}))

    def __str__(self) -> str:
        lines = [f"{'stage':>5}  {'layers':<10}{'fwd+bwd':>12}{'memory':>12}"]
        for s, r in enumerate(self.stages):
            extra = ("+emb " if s == 0 and self.meta.get("embedding") else "") + \
                    ("+head" if s == self.num_stages - 1 and self.meta.get("head") else "")
            lines.append(f"{s:>5}  {(format_layer_ranges(list(r)) or '-') + ' ' + extra:<10}"
                         f"{self.stage_times[s]:>12.4g}{_mb(self.stage_memory[s]):>12}")
        lines.append(f"bottleneck {self.bottleneck:.4g}; layers per stage {self.counts}; offset {self.to_offsets()}")
        return "\n".join(lines)


# ---- the exact split ------------------------------------------------------------------------

def _best_split(weight: Callable[[int, int, int], float], feasible: Callable[[int, int, int], bool],
                num_layers: int, num_stages: int, min_layers: int,
                bound: Optional[float] = None) -> Optional[List[int]]:
    """Split points ``[0, c1, ..., num_layers]`` minimising max_s weight(s, i, j) (``bound`` None),
    or, with ``bound``, minimising sum_s weight(s, i, j)^2 subject to every weight <= bound.
    ``weight(s, i, j)`` is stage s holding layers i..j-1. None when nothing is feasible."""
    inf = float("inf")
    L, S = num_layers, num_stages
    # best[s][j]: value of the best split of layers 0..j-1 over stages 0..s
    best = [[inf] * (L + 1) for _ in range(S)]
    back = [[-1] * (L + 1) for _ in range(S)]
    for s in range(S):
        for j in ((L,) if s == S - 1 else range(L + 1)):
            starts = range(j - min_layers + 1) if s > 0 else ((0,) if j >= min_layers else ())
            for i in starts:
                prev = 0.0 if s == 0 else best[s - 1][i]
                if prev == inf or not feasible(s, i, j):
                    continue
                w = weight(s, i, j)
                if bound is None:
                    value = max(prev, w)
                elif w > bound:
                    continue
                else:
                    value = prev + w * w
                if value < best[s][j]:
                    best[s][j], back[s][j] = value, i
    if best[S - 1][L] == inf:
        return None
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(back[s][cuts[-1]])
    cuts.append(0)
    return cuts[::-1]


def plan_stages(layer_costs: Union[Sequence[CostLike], LayerProfile], num_stages: int,
                memory_limit_bytes: Optional[float] = None, embedding_cost: Optional[CostLike] = None,
                head_cost: Optional[CostLike] = None, allow_empty_stages: bool = False) -> StagePlan:
    """The split of the layers over ``num_stages`` stages (one run of consecutive layers each)
    with the smallest largest stage time, every stage within ``memory_limit_bytes`` (None: no
    limit). ``layer_costs``: ``LayerCost`` objects, plain numbers (times), or a ``LayerProfile``
    (its embedding/head costs are used unless given here). ``embedding_cost`` is added to stage 0,
    ``head_cost`` to the last stage. Stages hold at least one layer unless
    ``allow_empty_stages``. Raises ValueError naming the stage when no split fits the memory."""
    if isinstance(layer_costs, LayerProfile):
        embedding_cost = layer_costs.embedding if embedding_cost is None else embedding_cost
        head_cost = layer_costs.head if head_cost is None else head_cost
        layer_costs = layer_costs.layers
    costs = [_as_cost(c, f"layer_costs[{i}]") for i, c in enumerate(layer_costs)]
    emb = _as_cost(embedding_cost, "embedding_cost") if embedding_cost is not None else LayerCost(0.0)
    head = _as_cost(head_cost, "head_cost") if head_cost is not None else LayerCost(0.0)
    L = len(costs)
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"plan_stages: num_stages={num_stages!r} must be a positive integer")
    if L == 0:
        raise ValueError("plan_stages: layer_costs is empty; give one cost per transformer layer")
    min_layers = 0 if allow_empty_stages else 1
    if L < num_stages and not allow_empty_stages:
        raise ValueError(f"plan_stages: {L} layers cannot fill num_stages={num_stages} stages with at least one "
                         "layer each; use fewer stages or allow_empty_stages=True")
    if memory_limit_bytes is not None and (not isinstance(memory_limit_bytes, (int, float))
                                           or isinstance(memory_limit_bytes, bool) or memory_limit_bytes <= 0):
        raise ValueError(f"plan_stages: memory_limit_bytes={memory_limit_bytes!r} must be a number > 0 or None")
    S = num_stages
    pre_t, pre_f, pre_m = [0.0], [0.0], [0]
    for c in costs:
        pre_t.append(pre_t[-1] + c.time)
        pre_f.append(pre_f[-1] + c.fwd)
        pre_m.append(pre_m[-1] + c.memory)

    def ends(s, attr):
        return (getattr(emb, attr) if s == 0 else 0) + (getattr(head, attr) if s == S - 1 else 0)

    def time_of(s, i, j):
        return pre_t[j] - pre_t[i] + ends(s, "time")

    def mem_of(s, i, j):
        return pre_m[j] - pre_m[i] + ends(s, "memory")

    def fits(s, i, j):
        return memory_limit_bytes is None or mem_of(s, i, j) <= memory_limit_bytes

    cuts = _best_split(time_of, fits, L, S, min_layers)
    if cuts is None:
        least = _best_split(mem_of, lambda s, i, j: True, L, S, min_layers)
        mems = [mem_of(s, least[s], least[s + 1]) for s in range(S)]
        worst = max(range(S), key=lambda s: mems[s])
        a, b = least[worst], least[worst + 1]
        parts = ([f"embedding {_mb(emb.memory)}"] if worst == 0 and emb.memory else []) + \
                ([f"layers {format_layer_ranges(list(range(a, b)))} {_mb(pre_m[b] - pre_m[a])}"] if b > a else []) + \
                ([f"head {_mb(head.memory)}"] if worst == S - 1 and head.memory else [])
        raise ValueError(f"plan_stages: no split of {L} layers into {S} stages fits memory_limit_bytes="
                         f"{memory_limit_bytes:g} ({_mb(memory_limit_bytes)}) per stage: even the split with the "
                         f"least memory per stage, {[b - a for a, b in zip(least, least[1:])]} layers, needs "
                         f"{_mb(mems[worst])} on stage {worst} ({' + '.join(parts) or 'nothing'}); raise the limit to "
                         f"at least {mems[worst]:g} bytes or use more stages")
    bottleneck = max(time_of(s, cuts[s], cuts[s + 1]) for s in range(S))
    even = _best_split(time_of, fits, L, S, min_layers, bound=bottleneck * (1 + 1e-12) + 1e-300)
    cuts = even or cuts
    stages = [range(cuts[s], cuts[s + 1]) for s in range(S)]
    fwd = [pre_f[r.stop] - pre_f[r.start] + ends(s, "fwd") for s, r in enumerate(stages)]
    total = [time_of(s, r.start, r.stop) for s, r in enumerate(stages)]
    return StagePlan(stages, total, fwd, [t - f for t, f in zip(total, fwd)],
                     [int(mem_of(s, r.start, r.stop)) for s, r in enumerate(stages)],
                     None if memory_limit_bytes is None else int(memory_limit_bytes),
                     {"embedding": embedding_cost is not None, "head": head_cost is not None})


# ---- measuring --------------------------------------------------------------------------------

def _sync(out) -> None:
    """Wait for ``out`` (a tensor or nested tuple) to be computed: copy it to the host, as the
    runtime's recorded steps do (``ms.runtime.synchronize`` only logs an error on CPU)."""
    if isinstance(out, (tuple, list)):
        for item in out:
            _sync(item)
    elif hasattr(out, "asnumpy"):
        out.asnumpy()


def _timed(fn, args, steps: int, warmup: int):
    out = None
    for _ in range(warmup):
        out = fn(*args)
        _sync(out)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = fn(*args)
        _sync(out)
        times.append(time.perf_counter() - start)
    # the median: one call slowed by another process on the shared cores does not move it
    return statistics.median(times), out


def _param_bytes(cell) -> int:
    return int(sum(p.size * p.itemsize for p in cell.trainable_params()))


def _cell_cost(cell, args, sens_like, mode: str, steps: int, warmup: int, input_grads: bool = True):
    """(LayerCost, output) of one Cell: forward time, then backward (gradient function with a
    sensitivity of ones, recomputing the forward, as the pipeline runtime does)."""
    import mindspore as ms
    from mindspore import ParameterTuple, ops

    params = ParameterTuple(cell.trainable_params())
    grad = ops.GradOperation(get_all=input_grads, get_by_list=True, sens_param=True)(cell, params)
    fwd_fn, bwd_fn = cell, grad
    if mode == "jit":
        fwd_fn = ms.jit(lambda *a: cell(*a))
        bwd_fn = ms.jit(lambda *a: grad(*a))
    fwd, out = _timed(fwd_fn, args, steps, warmup)
    sens = ops.ones_like(out if sens_like is None else sens_like)
    bwd, _ = _timed(bwd_fn, tuple(args) + (sens,), steps, warmup)
    return LayerCost(fwd, bwd, _param_bytes(cell)), out


def _head_cell(model):
    """final norm + output layer + loss of a GPTModel, as one Cell ``(hidden, labels) -> loss``."""
    from mindspore import nn

    class _Head(nn.Cell):
        def __init__(self, m):
            super().__init__()
            self.norm = m.decoder.final_layernorm
            self.output_layer = m.output_layer
            self.loss = m.loss
            self.embedding = m.embedding if m.tie else None

        def construct(self, x, labels):
            if self.norm is not None:
                x = self.norm(x)
            if self.embedding is not None:
                logits = self.output_layer(x, self.embedding.word_embeddings.weight)
            else:
                logits = self.output_layer(x)
            return self.loss(logits, labels)
    return _Head(model)


def measure_layers(model_or_layers, sample_input, steps: int = 3, warmup: int = 1,
                   mode: str = "pynative", labels=None) -> LayerProfile:
    """Time every layer's forward and backward on its real input and count its parameter bytes.

    ``model_or_layers``: a ``GPTModel`` (its ``decoder.layers``, plus embedding and head when it
    has them; ``sample_input`` are token ids (b, s), ``labels`` default to the ids), or a sequence
    of layer Cells (``sample_input`` is the first layer's input tensor). Times are seconds per
    call, the mean of ``steps`` calls after ``warmup`` untimed ones; ``mode="jit"`` compiles each
    layer. Run it on one process with the whole model, before building the pipeline."""
    if not isinstance(steps, int) or steps < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"measure_layers: steps={steps!r} must be >= 1 and warmup={warmup!r} >= 0")
    if mode not in ("pynative", "jit"):
        raise ValueError(f"measure_layers: mode={mode!r}; valid modes are 'pynative' and 'jit'")
    decoder = getattr(model_or_layers, "decoder", None)
    embedding = head = None
    if decoder is not None and hasattr(decoder, "layers"):
        model, layers = model_or_layers, list(decoder.layers)
        x = sample_input
        if getattr(model, "pre_process", False):
            embedding, x = _cell_cost(model.embedding, (sample_input,), None, mode, steps, warmup, input_grads=False)
    else:
        try:
            layers, model = list(model_or_layers), None
        except TypeError:
            raise TypeError(f"measure_layers: expected a GPTModel (with .decoder.layers) or a sequence of layer "
                            f"Cells, got {type(model_or_layers).__name__}") from None
        x = sample_input
    if not layers:
        raise ValueError("measure_layers: the model has no layers to measure")
    costs = []
    for layer in layers:
        cost, x = _cell_cost(layer, (x,), None, mode, steps, warmup)
        costs.append(cost)
    if model is not None and getattr(model, "post_process", False):
        import mindspore as ms
        from mindspore import ops
        y = sample_input if labels is None else labels
        cell = _head_cell(model)
        head, _ = _cell_cost(cell, (x, y), ops.ones((), ms.float32), mode, steps, warmup)
    return LayerProfile(costs, embedding, head, steps, mode)


def measure_stage_times(stage_cells: Sequence, sample_input, labels=None, steps: int = 3, warmup: int = 1,
                        mode: str = "pynative") -> List[LayerCost]:
    """Measure whole stages the same way (forward, and backward with a sensitivity): ``stage_cells``
    in pipeline order, each fed the previous one's output; the last is called ``(x, labels)`` when
    ``labels`` is given (a GPTModel stage with ``post_process`` then returns the loss)."""
    import mindspore as ms
    from mindspore import ops
    out, x = [], sample_input
    for s, cell in enumerate(stage_cells):
        last = s == len(stage_cells) - 1 and labels is not None
        args = (x, labels) if last else (x,)
        ids_in = s == 0 and x.dtype in (ms.int32, ms.int64)     # no gradient for token ids
        cost, x = _cell_cost(cell, args, ops.ones((), ms.float32) if last else None, mode, steps, warmup,
                             input_grads=not ids_in)
        out.append(cost)
    return out


def stage_times_from_trace(trace) -> Dict[int, float]:
    """Mean forward + backward time per stage from a runtime trace (``runtime.trace``: a list of
    ``(MetaStep, start, end)``; or a measured ``Timeline``), for ``report``."""
    per: Dict[Tuple[int, str], List[float]] = {}
    items = ([(t.step, t.start, t.end) for ts in trace.steps.values() for t in ts]
             if hasattr(trace, "steps") else trace)
    for step, start, end in items:
        if step.type.is_compute:
            per.setdefault((step.stage_index, step.type.name), []).append(end - start)
    stages = sorted({s for s, _ in per})
    return {s: sum(sum(v) / len(v) for (t, k), v in per.items() if t == s) for s in stages}


def report(plan: StagePlan, measured_stage_times, file=None) -> str:
    """A table of predicted against measured stage times (``measured_stage_times``: numbers,
    ``LayerCost`` objects or ``{stage: time}``); printed to ``file`` (default stdout) and returned."""
    if isinstance(measured_stage_times, dict):
        measured = [measured_stage_times.get(s) for s in range(plan.num_stages)]
    else:
        measured = [m.time if isinstance(m, LayerCost) else m for m in measured_stage_times]
    if len(measured) != plan.num_stages:
        raise ValueError(f"report: {len(measured)} measured stage times for a plan of {plan.num_stages} stages")
    lines = [f"{'stage':>5}  {'layers':<9}{'predicted':>11}{'measured':>11}{'ratio':>8}"]
    for s, r in enumerate(plan.stages):
        m = measured[s]
        ratio = f"{m / plan.stage_times[s]:.2f}" if m is not None and plan.stage_times[s] > 0 else "-"
        lines.append(f"{s:>5}  {format_layer_ranges(list(r)) or '-':<9}{plan.stage_times[s] * 1e3:>9.2f}ms"
                     f"{'-' if m is None else f'{m * 1e3:.2f}ms':>11}{ratio:>8}")
    known = [m for m in measured if m is not None]
    if known:
        lines.append(f"bottleneck: predicted {plan.bottleneck * 1e3:.2f} ms, measured {max(known) * 1e3:.2f} ms "
                     f"(ratio {max(known) / plan.bottleneck:.2f})")
    text = "\n".join(lines)
    print(text, file=file)
    return text
