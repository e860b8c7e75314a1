"""Execute any exec order: stage Cells, microbatches, point-to-point transfers, gradients.

One loop runs ``schedule.local_order``. Data between steps lives in one run's tables (``_RunState``)
keyed like the validator's data model: ``acts[(m, s)]`` is stage ``s``'s output for microbatch ``m``
and ``grads[(m, s)]`` the gradient w.r.t. stage ``s``'s input. Sends and receives move entries of those
tables between ranks (``distributed.comm.send/recv``, blocking rendezvous as the validator
assumes; the received tensor is not copied to the host: the step that uses it waits for it);
handoffs between stages on one rank need no transfer.

The last stage's loss is divided by ``micro_batch_num`` and weight gradients are summed over
microbatches, so the result equals one step on the whole batch.

Backward without recompute (the default): a forward step runs the stage function once under
MindSpore's PyNative autograd recorder (one record per microbatch, keyed by the stage function and
that microbatch's input tensors, see :class:`_Tape`), and the backward step runs that record's
backward with the received gradient as sensitivity -- the forward is not run again, in PyNative
and under ``mode="jit"`` (there the stage function is a compiled graph: called under the recorder,
MindSpore compiles its forward so that it also returns what its backward graph needs, and the
backward graph takes those). Several records are outstanding at once (every schedule keeps
microbatches in flight) and are consumed in any order. The activations of a microbatch live from
its FWD to its BWD (or BWD_INPUT: a split backward computes input and weight gradients in one pass
at BWD_INPUT and BWD_WEIGHT then has nothing left to compute). MindSpore 2.10's ``ms.vjp`` cannot
do this: it records with a nesting order that only finds the latest outstanding record ("Can not
find top cell for backward" for any other). Under jit, a stage holding a custom backward (a Cell
``bprop``: every collective of ``distributed.comm``, sharding's redistributions, i.e. tensor-parallel
stages) keeps the recomputing backward below, with a warning: MindSpore 2.10 fails to compile a
PyNative gradient through a compiled graph that holds one (``has_custom_backward``).

Under jit, a last stage whose BWD of each microbatch follows its FWD (1F1B) runs the two as one
compiled call (``PipelineRuntime._fused_pairs``): one graph costs less than a taped forward and its
backward, and a recomputing stage saves its second forward.

Settings from the environment (``MFC_PIPELINE_*``) are read once into a ``RuntimeOptions``
(``options.py``) when a stage or runtime is built; both take ``options=`` instead.

Recompute (``PipelineStage(..., recompute=True)``): only the stage input is kept, and the backward
is a gradient function that runs the stage forward again from it (split backward: separate
input- and weight-gradient functions, so twice). Layers marked by ``recompute_config``
(``Cell.recompute()``) are recomputed by MindSpore itself inside either path.

Random operators (dropout), recompute only: a forward step snapshots the random state (MindSpore's
per-kernel seed table and default generator, ``common.rng.rng_snapshot``) with the stage input; the
backward step restores it for its recomputed forward, then restores the state the run had reached,
so the gradients are those of the masks that produced the loss and the random stream goes on as if
the backward drew nothing. In PyNative that replays every microbatch's masks, in any order. Under
``mode="jit"`` an ``ops.dropout``'s seeds are compile-time constants and its mask follows its
compiled kernel's launch count: the restored table makes the backward graph compile with the
forward graph's seeds, and a stage whose backwards run the microbatches in forward order (every
built-in schedule) then draws the same masks; the runtime warns about an order that does not.
Without recompute the backward uses the masks its forward drew (they are in the record).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops
from mindspore.common.api import _pynative_executor
from mindspore.ops.composite.base import _Grad

from ..distributed import comm
from ..distributed.env import get_env
from ..common.rng import rng_restore, rng_snapshot
from .meta_step import MetaStep, MetaStepType as T, route_of
from .microbatch import MicrobatchConfig
from .options import RuntimeOptions

_META_LEN = 10  # ndim + up to 8 dims + dtype code, sent once per stage boundary
_DTYPES = (ms.float32, ms.float16, ms.bfloat16, ms.int32, ms.int64)


class Watchdog:
    """Bounds a blocking point-to-point exchange. A dead or stalled peer would leave this rank
    blocked inside a collective forever, and nothing in Python can interrupt that call; after
    ``timeout`` seconds the watchdog writes what was awaited (stage, microbatch, peer rank) to
    stderr and to ``$MFC_ERROR_FILE`` (the msrun harness reads it at once), then ends the process."""

    def __init__(self, timeout: float, waiting_for: str):
        self.timeout, self.waiting_for = timeout, waiting_for
        self.timer: Optional[threading.Timer] = None

    def _fire(self) -> None:
        text = (f"pipeline timeout: {self.waiting_for} did not complete within {self.timeout:.0f}s; the peer is "
                f"stalled or dead (see its log). Set MFC_PIPELINE_TIMEOUT or runtime.timeout to wait longer.\n")
        sys.stderr.write(text)
        sys.stderr.flush()
        path = os.environ.get("MFC_ERROR_FILE")
        if path:
            with open(path, "w") as f:
                f.write(text)
        os._exit(3)

    def __enter__(self):
        if self.timeout > 0:
            self.timer = threading.Timer(self.timeout, self._fire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.cancel()
        return False


class _Tape:
    """Forward records of one stage function, one per microbatch, each consumed by its backward.

    MindSpore's PyNative autograd keeps a forward record ("top cell") under a key made of the
    recorded function, the ids of its input tensors and the grad order. ``ms.vjp`` / ``GradOperation``
    raise the grad order for each further outstanding record of the same function, so only the
    latest one is found again (a stack). Recording with ``create_graph=False`` keeps the grad order
    at 1: every microbatch's record has its own key (its inputs are distinct tensors) and any of them
    can be consumed, in any order, by ``backward`` (which also frees it)."""

    def __init__(self, fn: Callable, params: ParameterTuple) -> None:
        # a function object of our own: its id is part of the key (a Cell's id would collide with
        # other users recording the same Cell)
        def recorded(*args):
            return fn(*args)
        self.fn, self.params = recorded, params
        self.grad_op = _Grad(get_all=True, get_by_list=True, sens_param=True, merge_forward=True)
        self.open: Dict[Tuple[int, ...], int] = {}   # ids of the input tensors of outstanding records

    def forward(self, args: Tuple) -> Tuple[Any, Tuple]:
        """Run and record; returns the output and the arguments to pass to ``backward``."""
        key = tuple(id(a) for a in args if isinstance(a, Tensor))
        if key in self.open:   # the same input tensors twice in flight: give this record its own
            args = tuple(ops.identity(a) if isinstance(a, Tensor) else a for a in args)
            key = tuple(id(a) for a in args if isinstance(a, Tensor))
        self.open[key] = 1
        ex = _pynative_executor
        ex.check_run(self.fn, *args, create_graph=False)
        ex.set_grad_flag(True)
        ex.new_graph(self.fn, *args)
        try:
            out = self.fn(*args)
        except BaseException:
            self.discard()
            raise
        ex.end_graph(self.fn, out, *args)
        return out, args

    def backward(self, args: Tuple, sens) -> Tuple[Tuple, Tuple]:
        """(input gradients, weight gradients) of the record made for ``args``."""
        self.open.pop(tuple(id(a) for a in args if isinstance(a, Tensor)), None)
        return _pynative_executor.grad(self.fn, self.grad_op, self.params, None, False, *args, sens)

    def discard(self) -> None:
        """Forget records left by a failed run (a later record could never be consumed otherwise)."""
        if self.open:
            self.open.clear()
            _pynative_executor.clear_res()


# MindSpore 2.10: a PyNative gradient through an ``ms.jit`` graph (ast capture) that contains a custom
# backward -- a Cell ``bprop`` or a ``_Function``, i.e. every collective of distributed.comm and the
# redistributions of sharding -- fails to compile: "TypeError: The parameters number of the function
# is 2, but the number of provided arguments is 1." (PyNative without jit, and GradOperation inside
# the jit graph, work). Such stages keep the recomputing backward under jit.
_JIT_RECORD_FAILURE = "The parameters number of the function is"


def has_custom_backward(cell: nn.Cell) -> bool:
    """True when ``cell`` or a Cell inside it defines ``bprop``."""
    return any(hasattr(type(c), "bprop") for _, c in cell.cells_and_names())


def _jit_recompute_warning(stage_index: int, why: str) -> None:
    warnings.warn(f"pipeline stage {stage_index}, mode='jit': {why}; MindSpore 2.10 cannot take a PyNative "
                  "gradient through a compiled graph holding a custom backward, so this stage recomputes its "
                  "forward in the backward (mode='pynative' keeps the forward's record)", RuntimeWarning, stacklevel=4)


class PipelineStage:
    """A stage's Cell, its index, the stage count and the global rank of every pipeline rank.

    ``pp_ranks[i]`` is the global rank of pipeline rank ``i`` (default: the world, in order). The last
    stage needs ``loss_fn(output, label) -> scalar``, or ``loss_in_cell=True`` when its Cell takes the
    label as its last argument and returns the loss (a tensor-parallel stage whose loss must see
    the vocab-split logits). With ``dp_group`` (the data-parallel replicas
    of this stage, each fed its own slice of the global batch) gradients and loss are averaged over
    the replicas after the last microbatch.

    What a memory strategy wrapping the stage (hsdp) may change, without importing this package:
    ``delegate_dp_reduction(owner)`` (it reduces over ``dp_group`` itself; ``dp_reduced_by`` is then
    ``owner``), ``weight_shapes`` (the full shapes the weight gradients are sized by, when the
    parameters are shards outside the Cells that use them) and ``compiled_inside`` (under jit those
    Cells are compiled apart and the stage function runs eagerly around them).

    ``recompute=False`` (default): the backward uses the forward's autograd record (the forward
    runs once per microbatch); ``recompute=True``: only the stage input is kept and the backward
    runs the forward again (less memory, one more forward per microbatch, two with a split
    backward). ``None``: ``options.recompute`` (``MFC_PIPELINE_RECOMPUTE=1`` in the environment).
    ``options``: the runtime settings (``RuntimeOptions``; default read from the environment now).

    Stage-local loss terms (a mixture-of-experts stage's load-balancing loss): a stage before the
    last whose Cell returns ``(activation, loss term)`` sends only the activation; the term is part
    of the step's loss where it was made: the runtime adds ``term / m`` to the loss it returns on
    this rank and its backward gives the term the sensitivity ``1 / m`` (the scaling of the last
    stage's loss), so nothing about it travels between stages.
    """

    def __init__(self, cell: nn.Cell, stage_index: int, stage_num: int,
                 pp_ranks: Optional[Sequence[int]] = None, loss_fn: Optional[Callable] = None,
                 dp_group=None, loss_in_cell: bool = False, recompute: Optional[bool] = None,
                 options: Optional[RuntimeOptions] = None) -> None:
        if not isinstance(cell, nn.Cell):
            raise TypeError(f"PipelineStage: cell must be a mindspore.nn.Cell, got {type(cell).__name__}")
        if not 0 <= stage_index < stage_num:
            raise ValueError(f"PipelineStage: stage_index={stage_index} must be in [0, {stage_num})")
        if stage_index == stage_num - 1 and loss_fn is None and not loss_in_cell:
            raise ValueError(f"PipelineStage: the last stage ({stage_index}) needs loss_fn(output, label), or "
                             f"loss_in_cell=True when its Cell takes (inputs..., label) and returns the loss")
        self.loss_in_cell = loss_in_cell
        self.options = options if options is not None else RuntimeOptions.from_env()
        self.recompute = bool(self.options.recompute if recompute is None else recompute)
        self.cell, self.stage_index, self.stage_num = cell, stage_index, stage_num
        self.pp_ranks = list(pp_ranks) if pp_ranks is not None else None
        self.loss_fn = loss_fn
        self.dp_group = dp_group
        self.dp_reduced_by = None   # see delegate_dp_reduction
        # set by hsdp level3, whose parameters are shards outside the Cells that use them: the
        # full shapes (of the weight gradients), and under jit that those Cells are compiled apart
        # (the stage function itself then runs eagerly around them)
        self.weight_shapes: Optional[Tuple[Tuple[int, ...], ...]] = None
        self.compiled_inside = False
        self.params = ParameterTuple(cell.trainable_params())
        self.grads: Optional[Tuple[Tensor, ...]] = None
        self._fns: Dict[Tuple[str, str], Any] = {}
        self._jit_recompute: Optional[bool] = None   # decided at the first jit run (see recomputes)
        self._units_recompute: Optional[bool] = None  # PyNative recompute units inside (see recomputes)
        # a stage before the last whose Cell returns (activation, loss term): the dtype of that term
        # (set by its first forward), see the class doc
        self.local_loss_dtype = None
        # the last stage of a route that is not the last stage index (DualPipe's down copy), set by
        # the schedule through mark_route_end
        self.route_last = False

    def mark_route_end(self, owner: str) -> None:
        """This stage computes the loss of the microbatches whose route ends here (``owner``, the
        schedule, names itself in the error): it needs ``loss_fn`` or ``loss_in_cell``."""
        if self.loss_fn is None and not self.loss_in_cell:
            raise ValueError(f"{owner}: stage {self.stage_index} is the last stage of a route and computes its "
                             "microbatches' loss, but it has no loss_fn; pass PipelineStage(..., "
                             "loss_fn=<(output, label) -> scalar>) or loss_in_cell=True for it")
        if self._fns:
            raise ValueError(f"{owner}: stage {self.stage_index} already ran as a stage inside a route; build a "
                             "new PipelineStage for this schedule")
        self.route_last = True

    def recomputes(self, mode: str) -> bool:
        """Whether this stage's backward runs its forward again in ``mode``: ``recompute=True``, or
        under jit a stage holding a custom backward (a collective), see ``has_custom_backward``."""
        if self.recompute:
            return True
        if mode != "jit":
            # MindSpore's PyNative recompute units (Cell.recompute(): recompute_config) pair their
            # re-run with records by nesting order: with several records outstanding their
            # gradients come out wrong (GPipe, 4 microbatches: 0.24 off), so such stages recompute
            if self._units_recompute is None:
                self._units_recompute = any(getattr(c, "_recompute_cell", None) is not None
                                            for _, c in self.cell.cells_and_names())
            return self._units_recompute
        if self.compiled_inside:
            return False
        if self._jit_recompute is None:
            self._jit_recompute = has_custom_backward(self.cell) and not self.options.bytecode_capture
            if self._jit_recompute:
                _jit_recompute_warning(self.stage_index, "it holds Cells with a custom bprop (collectives)")
        return self._jit_recompute

    def discard_records(self, mode: str) -> None:
        """Forget the forward records of microbatches that never ran their backward (a failed run)."""
        tape = self._fns.get(("tape", mode))
        if tape is not None:
            tape.discard()

    def jit_record_failed(self) -> None:
        """The compiled forward could not be recorded (a ``_Function`` inside): recompute from now on."""
        self._jit_recompute = True
        _jit_recompute_warning(self.stage_index, "its compiled forward could not be recorded for the gradient")

    def delegate_dp_reduction(self, owner) -> None:
        """``owner`` (e.g. hsdp) reduces this stage's gradients and loss over ``dp_group`` itself,
        once per step (reduce-scattered at level2/3): the runtime then leaves them local."""
        self.dp_reduced_by = owner

    @property
    def is_last(self) -> bool:
        """Computes the loss: the last stage, or the last stage of a route (``mark_route_end``)."""
        return self.stage_index == self.stage_num - 1 or self.route_last

    def objective(self, micro_batch_num: int) -> Callable:
        """Stage function: ``x -> output`` or, on the last stage, ``(x..., label) -> loss / m``."""
        if not self.is_last:
            return self.cell
        cell, loss_fn, scale = self.cell, self.loss_fn, 1.0 / micro_batch_num
        if self.loss_in_cell:   # e.g. a tensor-parallel GPT stage computing a vocab-parallel loss
            def last_in_cell(*args):
                return cell(*args) * scale
            return last_in_cell

        def last(*args):  # stage inputs..., label
            return loss_fn(cell(*args[:-1]), args[-1]) * scale
        return last

    @staticmethod
    def _fused(fn: Callable, params: ParameterTuple, input_grad: bool) -> Callable:
        """A last stage's forward and backward of one microbatch in one call, the weight gradients added
        to the accumulated ones passed after the stage arguments: ``(args..., acc...) -> (loss, input
        gradient or None, acc + weight gradients)`` (``input_grad=False``: the stage is where the
        microbatch enters, its input gradient goes nowhere). The loss's sensitivity is one, as in the
        backward step."""
        n = len(params)
        value_and_grad = ms.value_and_grad(fn, grad_position=0 if input_grad else None, weights=params)

        def fused(*args):
            k = len(args) - n
            loss, grads = value_and_grad(*args[:k])
            dx, weight_grads = grads if input_grad else (None, grads)
            summed = tuple(a + g for a, g in zip(args[k:], weight_grads))
            # the loss is ready long before the graph ends; an eager op or a host read of an output while
            # its graph still runs spins and slows that graph 2-3x (MindSpore 2.10 CPU, bench/early_read.py):
            # the loss is given out with the last gradients
            return ops.depend(loss, (dx, summed)), dx, summed
        return fused

    def compiled(self, kind: str, mode: str, micro_batch_num: int):
        """Forward / backward functions for ``mode`` (built once)."""
        key = (kind, mode)
        if key in self._fns:
            return self._fns[key]
        fn = self.objective(micro_batch_num)
        params = self.params
        if kind in ("forward", "tape"):
            out = fn
        elif kind == "backward":
            out = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)(fn, params)
        elif kind == "input_grad":
            out = ops.GradOperation(get_all=True, sens_param=True)(fn)
        elif kind == "weight_grad":
            out = ops.GradOperation(get_by_list=True, sens_param=True)(fn, params)
        elif kind in ("fused", "fused_first"):
            out = self._fused(fn, params, input_grad=kind == "fused")
        else:
            raise ValueError(kind)
        if mode == "jit" and not self.compiled_inside:
            # the stage's Parameters are passed as (trailing) arguments: a graph keeps the buffer
            # of a Parameter it captured, so set_data (checkpoint loading, hsdp level3's
            # shard/regather) would otherwise go unseen; passed ones are read at each call
            inner, n = out, len(params)

            def compiled(*args):
                return inner(*args[:len(args) - n])
            # MindSpore's own (asynchronous) launch, not common/graphs.compile_blocking: pp2 gained nothing
            # from it (0.528 vs 0.500 s/step), and with MoE's variable-count path these backward graphs
            # launched that way gave wrong gradients (docs/config.md, MFC_JIT_BLOCKING)
            jitted = ms.jit(compiled, capture_mode="bytecode") if kind == "tape" and self.options.bytecode_capture \
                else ms.jit(compiled)

            def out(*args):
                return jitted(*args, *params)
        if kind == "tape":
            out = _Tape(out, params)
        self._fns[key] = out
        return out


def _jit_replay_mismatches(order: Sequence[MetaStep]) -> List[str]:
    """Stages whose backward steps of one kind do not run the microbatches in forward order."""
    out = []
    for s in sorted({step.stage_index for step in order}):
        fwd = [st.micro_index for st in order if st.stage_index == s and st.type is T.FWD]
        for kind in (T.BWD, T.BWD_INPUT, T.BWD_WEIGHT):
            bwd = [st.micro_index for st in order if st.stage_index == s and st.type is kind]
            if bwd and bwd != fwd:
                out.append(f"stage {s}: {kind.name} microbatches {bwd} vs FWD {fwd}")
    return out


def _warn_if_jit_cannot_replay(order: Sequence[MetaStep]) -> None:
    """Under jit a random operator's seeds are compile-time constants and its mask follows the
    compiled kernel's launch count, so a stage's backward replays the forward's masks only when
    it runs the microbatches in forward order (every built-in schedule does)."""
    bad = _jit_replay_mismatches(order)
    if bad:
        warnings.warn("PipelineRuntime(mode='jit'): this order runs backward steps in another microbatch order "
                      f"than the forwards ({'; '.join(bad)}); under jit a random operator (ops.dropout) draws its "
                      "mask from its compiled kernel's launch count, so the backward would not see the forward's "
                      "dropout masks. Keep each stage's backwards in forward order, or use mode='pynative' "
                      "(which replays the random state of each forward exactly).", RuntimeWarning, stacklevel=3)


def _copy_weights(src: "PipelineStage", dst: "PipelineStage") -> None:
    if len(src.params) != len(dst.params) or any(a.shape != b.shape for a, b in zip(src.params, dst.params)):
        raise ValueError(f"pipeline: stage {dst.stage_index} is a copy of stage {src.stage_index} but its parameters "
                         f"{[tuple(p.shape) for p in dst.params]} differ from {[tuple(p.shape) for p in src.params]}")
    for a, b in zip(src.params, dst.params):
        b.set_data(a.value().copy())


def _all_reduce_flat(grads: Sequence[Tensor], ranks: Tuple[int, ...]) -> List[Tensor]:
    """Sum ``grads`` over ``ranks`` in one all-reduce per dtype (flattened and concatenated)."""
    from ..distributed.process_group import new_group
    group = new_group(ranks)
    out: List[Any] = [None] * len(grads)
    for dtype in sorted({g.dtype for g in grads}, key=str):
        idx = [i for i, g in enumerate(grads) if g.dtype == dtype]
        flat = ops.cat([grads[i].reshape(-1) for i in idx])
        flat = comm.all_reduce(flat, "sum", group)
        k = 0
        for i in idx:
            n = int(np.prod(grads[i].shape)) if grads[i].shape else 1
            out[i] = flat[k:k + n].reshape(grads[i].shape)
            k += n
    return out


def _nbytes(x) -> int:
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return int(x.nbytes) if isinstance(x, Tensor) else 0


class MemoryStats:
    """What a run of the runtime held on this rank, peak over the run's steps.

    * ``peak_microbatches[stage]`` / ``peak_bytes[stage]``: microbatches held for the backward and
      their stage inputs' bytes (received activations, or the microbatch on stage 0; not labels).
      Without recompute a microbatch is held from its FWD until its BWD or BWD_INPUT (the forward's
      autograd record: the simulator's ``peak_in_flight``); with recompute its stage input is held
      until BWD or BWD_WEIGHT (the simulator's ``peak_until_weight_grad``).
      ``peak_rank_microbatches``: all stages of this rank at once.
    * ``peak_table_bytes``: every distinct tensor in the runtime's tables at once (saved inputs and
      labels, activations waiting to be sent or handed off, gradients waiting to be sent or used).
    Without recompute the record also holds the activations inside the stage that its backward
    needs (MindSpore keeps them; their bytes are not counted here, and the CPU build has no
    allocator statistics); with recompute they exist only during one FWD or BWD step."""

    def __init__(self, stages) -> None:
        self.live_microbatches = {s: 0 for s in stages}
        self.live_bytes = {s: 0 for s in stages}
        self.peak_microbatches = dict(self.live_microbatches)
        self.peak_bytes = dict(self.live_bytes)
        self.peak_rank_microbatches = 0
        self.peak_table_bytes = 0

    def save(self, stage: int, nbytes: int) -> None:
        self.live_microbatches[stage] += 1
        self.live_bytes[stage] += nbytes
        self.peak_microbatches[stage] = max(self.peak_microbatches[stage], self.live_microbatches[stage])
        self.peak_bytes[stage] = max(self.peak_bytes[stage], self.live_bytes[stage])
        self.peak_rank_microbatches = max(self.peak_rank_microbatches, sum(self.live_microbatches.values()))

    def free(self, stage: int, nbytes: int) -> None:
        self.live_microbatches[stage] -= 1
        self.live_bytes[stage] -= nbytes

    def tables(self, acts, grads, saved) -> None:
        """Update the table peak from the runtime's tables (distinct tensors counted once)."""
        held = list(acts.values()) + list(grads.values()) + [t for args, _, _ in saved.values() for t in args]
        seen = {id(t): int(t.nbytes) for t in held if isinstance(t, Tensor)}
        self.peak_table_bytes = max(self.peak_table_bytes, sum(seen.values()))

    def as_dict(self) -> Dict[str, Any]:
        return {"peak_microbatches": dict(self.peak_microbatches), "peak_bytes": dict(self.peak_bytes),
                "peak_rank_microbatches": self.peak_rank_microbatches, "peak_table_bytes": self.peak_table_bytes}


@dataclass
class _RunState:
    """What one run of the local order holds, keyed like the validator's data model: ``acts[(m, s)]``
    stage ``s``'s output for microbatch ``m``, ``grads[(m, s)]`` the gradient w.r.t. stage ``s``'s
    input, ``saved[(m, s)]`` what stage ``s``'s backward of microbatch ``m`` needs (the record's
    arguments or the stage input, the random state, the input bytes), ``losses`` the losses made
    on this rank; ``xs`` / ``ys`` the run's microbatches of inputs and labels, ``m`` their count."""
    xs: Optional[Sequence]
    ys: Optional[Sequence]
    m: int
    side: Optional[Sequence] = None    # per microbatch: a tuple of tensors every stage takes after its input
    acts: Dict[Tuple[int, int], Any] = field(default_factory=dict)
    grads: Dict[Tuple[int, int], Any] = field(default_factory=dict)
    saved: Dict[Tuple[int, int], Any] = field(default_factory=dict)
    losses: List[Any] = field(default_factory=list)


class PipelineRuntime:
    """Runs one training step of a schedule on this rank's stages. After a run, ``memory`` is the
    :class:`MemoryStats` of that run. ``options`` (``RuntimeOptions``, default read from the
    environment now) give ``sync_transfers``, ``trace_file`` and ``timeout``; each is an attribute
    that may be changed between runs."""

    def __init__(self, schedule, mode: str = "pynative", options: Optional[RuntimeOptions] = None) -> None:
        if mode not in ("pynative", "jit"):
            raise ValueError(f"PipelineRuntime: mode={mode!r}; valid modes are 'pynative' and 'jit'")
        stages = {st.stage_index: st for st in schedule.stages}
        for st in stages.values():
            if not isinstance(st, PipelineStage):
                raise TypeError(f"PipelineRuntime: stage {st!r} is not a PipelineStage (a schedule built "
                                "from StageInfo can be validated and simulated, not run)")
        self.schedule, self.mode, self.stages = schedule, mode, stages
        # microbatch -> its stages (one chain through every stage unless the schedule has routes)
        self.routes = getattr(schedule, "routes", None)
        routes = self.routes.values() if self.routes is not None else [range(schedule.stage_num)]
        self.first_stages = {r[0] for r in routes}
        self.last_stages = {r[-1] for r in routes}
        if mode == "jit" and any(st.recomputes(mode) for st in stages.values()):
            _warn_if_jit_cannot_replay([st for st in schedule.local_order
                                        if stages[st.stage_index].recomputes(mode)])
        pp_ranks = next(iter(stages.values())).pp_ranks
        self.pp_ranks = pp_ranks if pp_ranks is not None else list(range(get_env().world_size))
        if len(self.pp_ranks) != schedule.pp_size:
            raise ValueError(f"PipelineRuntime: pp_ranks={self.pp_ranks} has {len(self.pp_ranks)} ranks "
                             f"but the schedule has pp_size={schedule.pp_size}")
        self._boundary: Dict[int, Tuple[Tuple[int, ...], Any]] = {}  # stage -> (output shape, dtype)
        self._pending = None   # the last transfer issued: (its result, what, peer rank)
        self.options = options = options if options is not None else RuntimeOptions.from_env()
        # wait for every transfer on the host (the runtime before issue 20; for benchmarks comparing the two)
        self.sync_transfers = options.sync_transfers
        # set ``record = True`` to time every step of the next runs into ``trace`` as
        # (MetaStep, start, end) in seconds; compute steps then synchronise (for benchmarks)
        self.record = False
        self.trace: List[Tuple[MetaStep, float, float]] = []
        # record every run and append it to <trace_file>.rank<r>.jsonl as
        # {"start", "end", "steps": [[type, micro, stage, start, end], ...]} (perf_counter seconds;
        # bench/trainer.py's per-step breakdown reads it)
        self.trace_file = options.trace_file
        if self.trace_file:
            self.record = True
        self.memory = MemoryStats(sorted(stages))
        self._fused_cache = None   # (local order, its fused (microbatch, stage) pairs), see _fused_pairs
        # seconds a send/recv may block before the watchdog reports the stalled peer and ends
        # this process (a rank blocked inside a collective cannot be interrupted from Python)
        self.timeout = options.timeout
        if getattr(schedule, "copies", None) and not getattr(schedule, "copies_synced", False):
            self.sync_copies()   # every copy of a model stage starts from the same weights
            schedule.copies_synced = True

    def _rank_of(self, stage: int) -> int:
        return self.pp_ranks[self.schedule.placement[stage]]

    # ---- point to point with a one-time shape handshake ---------------------------------------
    def _send(self, x, stage: int, to_stage: int, announce: bool, what: str = "tensor"):
        dst = self._rank_of(to_stage)
        with Watchdog(self.timeout, f"stage {stage} (rank {get_env().rank}) sending {what} to stage "
                                    f"{to_stage} (rank {dst})"):
            if announce:
                meta = np.zeros((_META_LEN,), np.float32)
                meta[0] = len(x.shape)
                meta[1:1 + len(x.shape)] = x.shape
                meta[-1] = _DTYPES.index(x.dtype)
                comm.send(Tensor(meta), dst)
            self._pending = (comm.send(x, dst), what, dst)   # no host sync: the run waits once at its end
            if self.sync_transfers:
                self._pending[0].asnumpy()

    def _recv(self, from_stage: int, like_shape=None, dtype=None, what: str = "tensor", to_stage: int = -1):
        src = self._rank_of(from_stage)
        with Watchdog(self.timeout, f"stage {to_stage} (rank {get_env().rank}) waiting for {what} from "
                                    f"stage {from_stage} (rank {src})"):
            if like_shape is None:
                meta = comm.recv(Tensor(np.zeros((_META_LEN,), np.float32)), src).asnumpy()
                ndim = int(meta[0])
                like_shape, dtype = tuple(int(d) for d in meta[1:1 + ndim]), _DTYPES[int(meta[-1])]
                self._boundary[from_stage] = (like_shape, dtype)
            out = comm.recv(ops.zeros(like_shape, dtype), src)
            if self.sync_transfers:
                out.asnumpy()
        self._pending = (out, what, src)   # no host sync: the step using ``out`` waits for it
        return out

    def _check_boundary(self, stage: int, x) -> bool:
        """True the first time stage ``stage`` sends (then the shape is announced)."""
        known = self._boundary.get(stage)
        if known is None:
            self._boundary[stage] = (tuple(x.shape), x.dtype)
            return True
        if known != (tuple(x.shape), x.dtype):
            raise ValueError(f"pipeline: stage {stage} output changed from shape {known[0]} {known[1]} "
                             f"to {tuple(x.shape)} {x.dtype}; every microbatch must have the same shape")
        return False

    # ---- one step -------------------------------------------------------------------------------
    def run(self, inputs=None, labels=None, config: Optional[MicrobatchConfig] = None):
        """Run the schedule once. Rank of stage 0 passes ``inputs`` (a tensor, or a tuple of the
        first stage's arguments), rank of the last stage ``labels``; both are whole batches split
        by ``config`` (default: tensors along dim 0, scalars and non-tensors replicated). Returns
        the mean microbatch loss on the last stage's rank (plus this rank's stage-local loss terms,
        see PipelineStage: the sum over the pipeline ranks is the step's loss), else None; each
        stage's summed weight gradients are in ``stage.grads``."""
        m = self.schedule.micro_batch_num
        config = config or MicrobatchConfig()
        has_first = bool(self.first_stages & set(self.stages))
        has_last = bool(self.last_stages & set(self.stages))
        return self.run_microbatches(
            config.split_inputs(inputs, m) if has_first and inputs is not None else inputs,
            config.split_labels(labels, m) if has_last and labels is not None else labels)

    def run_microbatches(self, xs=None, ys=None, side=None):
        """``run`` on lists of ``micro_batch_num`` microbatches. ``side``: a list of ``micro_batch_num``
        tuples of tensors every stage takes after its input (and before the labels on the last stage):
        per-token data each stage needs, e.g. a packed row's position and segment ids; a label may be a
        tuple too (e.g. labels and the loss mask)."""
        m = self.schedule.micro_batch_num
        for name, data, ends in (("inputs", xs, self.first_stages), ("labels", ys, self.last_stages)):
            mine = sorted(ends & set(self.stages))
            if mine and (data is None or len(data) != m):
                raise ValueError(f"pipeline: this rank runs stage {mine[0]} "
                                 f"and needs {m} microbatches of {name}, got "
                                 f"{'none' if data is None else len(data)}"
                                 + (" (all of the step's microbatches: each route takes its own)"
                                    if self.routes is not None else ""))
        if side is not None and len(side) != m:
            raise ValueError(f"pipeline: side inputs for {len(side)} microbatches, the schedule runs {m}")
        run = _RunState(xs, ys, m, side)
        self.memory = memory = MemoryStats(sorted(self.stages))
        for st in self.stages.values():
            # ops.zeros, not zeros_like: for a Parameter shrunk to its shard (set_data(slice_shape=True))
            # zeros_like was measured to return the pre-shrink shape under msrun (vocab-parallel embedding)
            shapes = st.weight_shapes or tuple(tuple(p.shape) for p in st.params)
            st.grads = tuple(ops.zeros(shape, p.dtype) for shape, p in zip(shapes, st.params))
        run_start, first = time.perf_counter(), len(self.trace)
        try:
            for step in self.schedule.local_order:
                start = time.perf_counter() if self.record else 0.0
                done = self._execute(step, run)
                if self.record:   # wait for the step's own result (a transfer's too) to time it
                    self._sync(done if done is not None or not step.type.is_p2p or self._pending is None
                               else self._pending[0])
                    self.trace.append((step, start, time.perf_counter()))
                memory.tables(run.acts, run.grads, run.saved)
        except BaseException:
            for st in self.stages.values():   # records of microbatches that never ran backward
                st.discard_records(self.mode)
            raise
        self._wait_for_transfers()
        losses = run.losses
        loss = sum(losses[1:], losses[0]) if losses else None
        self._sum_copies()
        self._sum_tied()
        loss = self._average_over_replicas(loss)
        if self.trace_file:
            self._write_trace(run_start, first)
        return loss

    def _write_trace(self, run_start: float, first: int) -> None:
        """Append this run's steps to the trace file (and drop them from ``trace``)."""
        steps = self.trace[first:]
        del self.trace[first:]
        row = {"start": run_start, "end": time.perf_counter(),
               "steps": [[st.type.name, st.micro_index, st.stage_index, a, b] for st, a, b in steps]}
        with open(f"{self.trace_file}.rank{get_env().rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def _wait_for_transfers(self) -> None:
        """One host sync per run, on its last transfer (collectives complete in issue order): a
        stalled peer is reported here by the watchdog instead of blocking a later, unguarded call."""
        pending, self._pending = self._pending, None
        if pending is not None:
            out, what, peer = pending
            with Watchdog(self.timeout, f"rank {get_env().rank} waiting for this step's transfers to finish "
                                        f"(the last one: {what}, peer rank {peer})"):
                out.asnumpy()

    @staticmethod
    def _sync(done) -> None:
        """Wait for a compute step's result (copy it to the host: ``ms.runtime.synchronize``
        only logs an error on CPU)."""
        if done is not None:
            done.asnumpy()

    def _execute(self, step: MetaStep, run: _RunState):
        """One step of the local order; returns a compute step's last result (to wait for)."""
        mb, s, t = step.micro_index, step.stage_index, step.type
        stage = self.stages.get(s)
        acts, grads, saved, m = run.acts, run.grads, run.saved, run.m
        if t is T.FWD:
            x = run.xs[mb] if s == self._first(mb) else acts.pop((mb, s - 1))   # now held as this stage's saved input
            args = tuple(x) if isinstance(x, (tuple, list)) else (x,)  # first stage: several inputs
            nbytes = _nbytes(args)
            self.memory.save(s, nbytes)
            if run.side is not None:
                args = args + tuple(run.side[mb])
            if stage.is_last:
                y = run.ys[mb]
                args = args + (tuple(y) if isinstance(y, (tuple, list)) else (y,))
            if (mb, s) in self._fused_pairs():
                return self._forward_backward(mb, s, stage, args, nbytes, run)
            out = None
            if not stage.recomputes(self.mode):   # recorded: the backward uses this forward's record
                try:
                    out, args = stage.compiled("tape", self.mode, m).forward(args)
                    saved[(mb, s)] = (args, None, nbytes)   # args: the record's key
                except TypeError as e:
                    if self.mode != "jit" or _JIT_RECORD_FAILURE not in str(e):
                        raise
                    stage.jit_record_failed()
            if stage.recomputes(self.mode):
                saved[(mb, s)] = (args, rng_snapshot(), nbytes)   # the backward replays this random state
                out = stage.compiled("forward", self.mode, m)(*args)
            if stage.is_last:
                run.losses.append(out)
            elif isinstance(out, tuple):   # (activation, stage-local loss): see PipelineStage
                out, local = out
                stage.local_loss_dtype = local.dtype
                run.losses.append(local * (1.0 / m))   # scaled as the last stage's loss
            acts[(mb, s)] = out
            return out
        elif t in (T.BWD, T.BWD_INPUT, T.BWD_WEIGHT):
            return self._backward(step, stage, run)
        elif t is T.FWD_SEND:
            out = acts.pop((mb, s))
            self._send(out, s, s + 1, self._check_boundary(s, out), f"the activation of microbatch {mb}")
        elif t is T.FWD_RECV:
            known = self._boundary.get(s - 1)
            acts[(mb, s - 1)] = self._recv(s - 1, *(known or (None, None)),
                                           what=f"the activation of microbatch {mb}", to_stage=s)
        elif t is T.BWD_SEND:
            self._send(grads.pop((mb, s)), s, s - 1, announce=False, what=f"the gradient of microbatch {mb}")
        elif t is T.BWD_RECV:
            shape, dtype = self._boundary[s]   # stage s announced its output shape when it first sent
            grads[(mb, s + 1)] = self._recv(s + 1, shape, dtype, what=f"the gradient of microbatch {mb}",
                                            to_stage=s)
        # handoffs: producer and consumer share the tables on this rank
        return None

    def _fused_pairs(self) -> set:
        """The (microbatch, stage) whose FWD and BWD run as one compiled call (``PipelineStage._fused``):
        under jit, a last stage whose BWD of a microbatch is its rank's next compute step after that
        FWD, with only receives of later activations between (1F1B's last stage: every
        microbatch). The forward then leaves no record: a taped forward and its backward cost 14-16 ms
        more per microbatch than one graph (the bench Llama's last stage, one core), and a recomputing
        stage (collectives inside) saves its second forward. The moved receives wait a little longer;
        nothing the fused step computes comes from another rank, so no wait can cycle. A stage fuses all
        of its microbatches or none."""
        order = self.schedule.local_order
        if self._fused_cache is not None and self._fused_cache[0] is order:
            return self._fused_cache[1]
        pairs = set()
        for i, step in enumerate(order if self.mode == "jit" else ()):
            stage = self.stages.get(step.stage_index)
            if step.type is not T.FWD or not stage.is_last or stage.compiled_inside or not stage.options.fuse_last:
                continue
            nxt = next((o for o in order[i + 1:] if o.type is not T.FWD_RECV), None)
            if nxt is not None and nxt.type is T.BWD and (nxt.micro_index, nxt.stage_index) == \
                    (step.micro_index, step.stage_index):
                pairs.add((step.micro_index, step.stage_index))
        # a stage fuses all of its microbatches or none: under jit a dropout's masks follow its compiled
        # kernel's launch count, so the forwards of one stage must all run in the same graph
        partly = {st.stage_index for st in order if st.type is T.FWD and (st.micro_index, st.stage_index) not in pairs}
        pairs = {(mb, s) for mb, s in pairs if s not in partly}
        self._fused_cache = (order, pairs)
        return pairs

    def _forward_backward(self, mb: int, s: int, stage: "PipelineStage", args: Tuple, nbytes: int,
                          run: _RunState):
        """FWD and BWD of microbatch ``mb`` on last stage ``s`` in one call (``_fused_pairs``); the BWD
        step then has nothing left to do."""
        first = s == self._first(mb)
        loss, dx, stage.grads = stage.compiled("fused_first" if first else "fused", self.mode, run.m)(
            *args, *stage.grads)
        if not first:
            run.grads[(mb, s)] = dx
        self.memory.free(s, nbytes)
        run.losses.append(loss)
        return loss

    def _first(self, mb: int) -> int:
        """The stage where microbatch ``mb`` enters (0 unless the schedule has routes)."""
        return 0 if self.routes is None else route_of(mb, self.schedule.stage_num, self.routes)[0]

    def _sum_copies(self) -> None:
        """Schedules keeping several copies of a model stage (DualPipe: ``schedule.copies``, tuples of
        stage indices holding the same weights): each copy's gradient becomes the sum over the copies,
        so that the copies take the same update and stay equal. Copies on this rank are added here;
        copies on other pipeline ranks by one all-reduce over the ranks holding them (a process group
        of the distributed layer: DualPipe's mirror pair, within this data-parallel replica)."""
        groups = self._copy_groups()
        for _, local, _ in groups:
            if len(local) > 1:
                total = self._sum_local([self.stages[s].grads for s in local])
                for s in local:
                    self.stages[s].grads = total
        by_ranks: Dict[Tuple[int, ...], List[List[int]]] = {}
        for _, local, ranks in groups:
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).append(local)
        for ranks in sorted(by_ranks):   # same order on every member: copies in the schedule's order
            locals_ = by_ranks[ranks]
            reduced = _all_reduce_flat([g for local in locals_ for g in self.stages[local[0]].grads], ranks)
            k = 0
            for local in locals_:
                n = len(self.stages[local[0]].grads)
                for s in local:
                    self.stages[s].grads = tuple(reduced[k:k + n])
                k += n

    def _sum_tied(self) -> None:
        """Parameters held by several model stages under one name (``schedule.tied``: ``{name: stage indices}``,
        e.g. the embedding table on the first stage and its copy on the last one for multi-token prediction,
        as Megatron keeps a tied embedding on both ends): each holder's gradient of it becomes the sum over
        the model stages, so the copies take the same update and stay equal. A DualPipe copy of a stage
        (``schedule.copies[k][1:]``) already holds its stage's sum (``_sum_copies``) and adds zeros. Holders on
        this rank are added here, the pipeline ranks holding any by one all-reduce."""
        tied = getattr(self.schedule, "tied", None)
        if not tied:
            return
        copies = {s for group in getattr(self.schedule, "copies", None) or () for s in group[1:]}
        for name in sorted(tied):
            holders = tuple(tied[name])
            local = [s for s in holders if s in self.stages]
            if not local:
                continue
            index = {}
            for s in local:
                names = [p.name for p in self.stages[s].params]
                if name in names:       # (not when frozen, e.g. under LoRA: no gradient, the copies stay equal)
                    index[s] = names.index(name)
            local = [s for s in local if s in index]
            if not local:
                continue
            parts = [self.stages[s].grads[index[s]] for s in local if s not in copies]
            like = self.stages[local[0]].grads[index[local[0]]]
            total = sum(parts[1:], parts[0]) if parts else ops.zeros(like.shape, like.dtype)
            ranks = tuple(sorted({self._rank_of(s) for s in holders}))
            if len(ranks) > 1:
                total = _all_reduce_flat([total], ranks)[0]
            for s in local:
                grads = list(self.stages[s].grads)
                grads[index[s]] = total
                self.stages[s].grads = tuple(grads)

    def sync_copies(self) -> None:
        """Give every copy of a model stage the weights of its first copy (``schedule.copies[k][0]``,
        DualPipe's down copy): assigned on this rank, or summed over the ranks holding copies with
        zeros from every rank but the first copy's (exact). Runs once per schedule, at the
        runtime's construction; a checkpoint loaded into the first copies afterwards is copied by
        calling it again."""
        by_ranks: Dict[Tuple[int, ...], List[Tuple[int, List[int]]]] = {}
        for source, local, ranks in self._copy_groups():
            if source in self.stages:
                for s in local:
                    if s != source:
                        _copy_weights(self.stages[source], self.stages[s])
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).append((source, local))
        for ranks in sorted(by_ranks):
            flat = []
            for source, local in by_ranks[ranks]:
                st = self.stages[local[0]]
                flat += [p.value() if source in self.stages else ops.zeros(p.shape, p.dtype) for p in st.params]
            reduced = _all_reduce_flat(flat, ranks)
            k = 0
            for source, local in by_ranks[ranks]:
                n = len(self.stages[local[0]].params)
                for s in local:
                    if s != source:
                        for p, v in zip(self.stages[s].params, reduced[k:k + n]):
                            p.set_data(v.copy())
                k += n

    def _copy_groups(self) -> List[Tuple[int, List[int], Tuple[int, ...]]]:
        """For each copied model stage this rank holds: (its first copy's stage index, its local stage
        indices, the global ranks holding a copy, sorted), in the schedule's order of ``copies``."""
        out = []
        for copies in getattr(self.schedule, "copies", None) or ():
            local = [s for s in copies if s in self.stages]
            if local:
                ranks = tuple(sorted({self._rank_of(s) for s in copies}))
                out.append((copies[0], local, ranks))
        return out

    @staticmethod
    def _sum_local(grad_lists):
        return tuple(sum(gs[1:], gs[0]) for gs in zip(*grad_lists))

    def _average_over_replicas(self, loss):
        """Data parallel: mean of gradients (and of the loss) over each stage's replicas."""
        for st in self.stages.values():
            if st.dp_group is not None and st.dp_group.size > 1 and st.dp_reduced_by is None:
                st.grads = tuple(comm.all_reduce(g, "avg", st.dp_group) for g in st.grads)
        last = next((st for st in self.stages.values() if st.is_last), None)
        if last is None and loss is not None:   # stage-local losses only: their stage's replicas
            last = next(st for st in self.stages.values() if st.local_loss_dtype is not None)
        if loss is not None and last.dp_group is not None and last.dp_group.size > 1 \
                and last.dp_reduced_by is None:
            loss = comm.all_reduce(loss, "avg", last.dp_group)
        return loss

    def _sens(self, step: MetaStep, stage: PipelineStage, run: _RunState):
        mb, s = step.micro_index, step.stage_index
        acts, grads = run.acts, run.grads
        if stage.is_last:
            return ops.ones((), acts[(mb, s)].dtype)   # acts[(mb, s)]: the loss
        if stage.local_loss_dtype is not None:   # d(step loss)/d(stage-local loss) = 1/m, like the last stage's
            scale = 1.0 / self.schedule.micro_batch_num
            return grads[(mb, s + 1)], ops.full((), scale, dtype=stage.local_loss_dtype)
        return grads[(mb, s + 1)]

    def _backward(self, step: MetaStep, stage: PipelineStage, run: _RunState):
        if (step.micro_index, step.stage_index) in self._fused_pairs():   # ran with its forward
            return None
        entry = run.saved.get((step.micro_index, step.stage_index))
        if entry is None or entry[1] is None:   # no random state kept: a recorded forward (or its BWD_WEIGHT)
            return self._backward_recorded(step, stage, run)
        mb, s, t = step.micro_index, step.stage_index, step.type
        acts, grads, saved, m = run.acts, run.grads, run.saved, run.m
        args, rng_state, nbytes = saved[(mb, s)]
        sens = self._sens(step, stage, run)
        reached = rng_snapshot()
        rng_restore(rng_state)   # the recomputed forward draws the forward's dropout masks
        try:
            if t is T.BWD:
                input_grads, weight_grads = stage.compiled("backward", self.mode, m)(*args, sens)
                if s != self._first(mb):   # the first stage's input gradient goes nowhere
                    grads[(mb, s)] = input_grads[0]
                self._accumulate(stage, weight_grads)
                done = stage.grads[-1] if stage.grads else input_grads[0]
            elif t is T.BWD_INPUT:
                done = stage.compiled("input_grad", self.mode, m)(*args, sens)[0]
                if s != self._first(mb):
                    grads[(mb, s)] = done
            else:  # BWD_WEIGHT
                self._accumulate(stage, stage.compiled("weight_grad", self.mode, m)(*args, sens))
                done = stage.grads[-1] if stage.grads else None
        finally:
            rng_restore(reached)   # the random stream goes on as if the backward drew nothing
        if t is not T.BWD_INPUT:   # the microbatch is done on this stage: drop what it held
            saved.pop((mb, s), None)
            self.memory.free(s, nbytes)
            grads.pop((mb, s + 1), None)
            if stage.is_last:
                acts.pop((mb, s), None)
        return done

    def _backward_recorded(self, step: MetaStep, stage: PipelineStage, run: _RunState):
        """The backward of the forward's record: BWD, or BWD_INPUT computing input and weight
        gradients in one pass (its BWD_WEIGHT then has nothing left to do)."""
        mb, s, t = step.micro_index, step.stage_index, step.type
        if t is T.BWD_WEIGHT:
            return None
        acts, grads, m = run.acts, run.grads, run.m
        args, _, nbytes = run.saved.pop((mb, s))
        sens = self._sens(step, stage, run)
        input_grads, weight_grads = stage.compiled("tape", self.mode, m).backward(args, sens)
        if s != self._first(mb):   # the first stage's input gradient goes nowhere
            grads[(mb, s)] = input_grads[0]
        self._accumulate(stage, weight_grads)
        self.memory.free(s, nbytes)
        grads.pop((mb, s + 1), None)
        if stage.is_last:
            acts.pop((mb, s), None)
        return stage.grads[-1] if stage.grads else input_grads[0]

    @staticmethod
    def _accumulate(stage: PipelineStage, weight_grads):
        stage.grads = tuple(a + g for a, g in zip(stage.grads, weight_grads))
