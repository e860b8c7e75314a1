"""What happens to a chosen Cell: it becomes a recompute unit or a swap unit, without any change to
its class, its parameters' names or the model's Cell tree.

**Recompute.** ``Cell.recompute()`` marks the Cell for MindSpore's graph compiler: under ``ms.jit``
the compiler's recompute pass re-runs the Cell's forward operators in the backward graph (it
replays random operators with their original seeds, so dropout masks match). In PyNative, a Cell's
``_recompute_cell`` hook runs the Cell instead: MindSpore's reentrant recompute Cell runs the
forward without autograd, keeps only the inputs, and in its custom ``bprop`` re-runs the forward
with autograd and back-propagates. MindSpore 2.10 restores only the ``Generator`` state there, but
``ops.dropout`` draws its seeds from the per-kernel seed table of ``mindspore.common.seed``, so the
recomputed dropout mask would differ from the forward's (gradients off by ~10% on a tiny GPT with
dropout 0.1). :class:`RecomputeFunction` snapshots that table with the generator state in the
forward and replays it for the recomputation, then restores the state the step had reached.

**Swap.** In PyNative :class:`SwapFunction` runs the Cell's forward inside ``saved_tensors_hooks``
whose pack copies every activation saved for backward to a host NumPy buffer (the device tensor is
then free to go) and whose unpack brings it back when the backward needs it. On a CPU device
"device" and "host" are the same RAM, so this is a host copy, but the mechanism and its accounting
are those of a GPU/Ascend run. Under ``ms.jit`` the Cell is marked with MindSpore's
``Cell.offload`` (graph-mode activation offload, an Ascend feature); the CPU build compiles and runs
it unchanged -- there the graph's activations already live in host memory -- and
``ops.MoveTo``, the graph-mode copy, has no CPU kernel. So swap under ``jit`` on CPU moves nothing.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

from ..common.rng import rng_restore, rng_snapshot
from .meter import current_meter

try:   # MindSpore's reentrant PyNative recompute Cell (what Cell.recompute() installs)
    from mindspore.common.recompute import _RecomputeCell
except ImportError as err:   # pragma: no cover - pinned to mindspore 2.10
    raise ImportError("mindformers_core.recompute needs mindspore.common.recompute._RecomputeCell "
                      f"(MindSpore 2.10); this MindSpore does not have it: {err}") from None


class RecomputeFunction(_RecomputeCell):
    """PyNative recompute of ``cell`` with its random state replayed (see the module docstring)."""

    def __init__(self, cell, name: str):
        super().__init__(cell.construct)
        self.unit_name = name
        self._rng_states: List[Any] = []
        self._held: List[Any] = []

    def construct(self, *args, **kwargs):
        self._rng_states.append(rng_snapshot())
        meter = current_meter()
        self._held.append((meter, meter.hold(args)) if meter is not None else None)
        return super().construct(*args, **kwargs)

    def bprop(self, *args):
        state = self._rng_states.pop()
        held = self._held.pop()
        reached = rng_snapshot()
        rng_restore(state)
        try:
            return super().bprop(*args)
        finally:
            rng_restore(reached)
            if held is not None:
                meter, keys = held
                meter.recomputed[self.unit_name] += 1
                for key in keys:
                    meter.release(key)


class _HostCopy:
    """A swapped activation: a host NumPy buffer and the dtype to restore."""
    __slots__ = ("array", "dtype", "__weakref__")

    def __init__(self, array: np.ndarray, dtype):
        self.array, self.dtype = array, dtype


class _Kept:
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


class SwapFunction:
    """PyNative swap of ``cell``: its saved activations go to host when saved, back when used."""

    def __init__(self, cell, name: str):
        self.cell = cell
        self.unit_name = name
        self._weights = frozenset()
        self._copies = None

    def pack(self, t):
        # weights saved by an op stay where they are (the hook sees them as plain Tensors)
        if isinstance(t, Parameter) or t.data_ptr() in self._weights:
            return _Kept(t)
        # one buffer saved by several ops gets one copy; the source is referenced until the unit's
        # forward ends, so its address cannot be reused by another tensor meanwhile
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if self._copies is not None and key in self._copies:
            return self._copies[key][1]
        src = t.astype(ms.float32) if t.dtype == ms.bfloat16 else t
        host = _HostCopy(np.array(src.asnumpy(), copy=True), t.dtype)
        if self._copies is not None:
            self._copies[key] = (t, host)
        meter = current_meter()
        if meter is not None:
            meter.add_host(host, host.array.nbytes, self.unit_name)
        return host

    @staticmethod
    def unpack(held):
        if isinstance(held, _Kept):
            return held.tensor
        out = Tensor(held.array)
        return out.astype(held.dtype) if out.dtype != held.dtype else out

    def __call__(self, *args, **kwargs):
        self._weights = frozenset(p.data_ptr() for p in self.cell.get_parameters())
        self._copies = {}      # this call's copies by buffer; afterwards only the autograd engine holds them
        try:
            with ms.saved_tensors_hooks(self.pack, self.unpack):
                return self.cell.construct(*args, **kwargs)
        finally:
            self._copies = None


def set_recompute(cell, name: str, slice_activation: bool = False) -> None:
    """Make ``cell`` a recompute unit in both modes (graph flag + PyNative hook)."""
    if getattr(cell, "_mfc_recompute", None) is not None:
        raise ValueError(f"apply_recompute: Cell {name!r} is already a recompute unit; apply_recompute once per "
                         "model (build a fresh model to change the choice)")
    kwargs = {"recompute_slice_activation": True} if slice_activation else {}
    cell.recompute(**kwargs)                          # graph mode: the compiler's recompute pass
    cell._cells.pop("_recompute_cell", None)          # MindSpore registers its PyNative Cell as a sub-Cell;
    object.__setattr__(cell, "_recompute_cell", RecomputeFunction(cell, name))   # ours stays out of the tree
    object.__setattr__(cell, "_mfc_recompute", name)


def set_swap(cell, name: str, prefetch: Any = "Auto") -> None:
    """Make ``cell`` a swap unit (PyNative hook + ``Cell.offload`` for graph mode)."""
    if getattr(cell, "_mfc_swap", None) is not None:
        raise ValueError(f"apply_swap: Cell {name!r} is already a swap unit; apply_swap once per model")
    if getattr(cell, "_mfc_recompute", None) is not None:
        raise ValueError(f"apply_swap: Cell {name!r} is a recompute unit; a Cell is either recomputed or swapped")
    cell.offload(backward_prefetch=prefetch if isinstance(prefetch, int) and prefetch > 0 else "Auto")
    object.__setattr__(cell, "_recompute_cell", SwapFunction(cell, name))
    object.__setattr__(cell, "_mfc_swap", name)
