"""Counting the bytes MindSpore keeps for backward (PyNative).

Inside ``with ActivationMeter(model) as meter:`` every tensor the autograd engine saves for the
backward pass goes through MindSpore's ``saved_tensors_hooks``; the meter counts each distinct
buffer once (by data pointer) while it is held, and releases it when the engine drops it. The
inputs a recompute unit keeps (it saves nothing else) and the host copies of swapped tensors are
reported by the units themselves. Parameters saved for backward are weights, not activations:
they are counted apart (``param_bytes``).

``measure(fn, *args)`` runs ``fn``'s forward under ``mindspore.vjp``, reads the bytes held at the
end of the forward, runs the backward and returns the peak: the memory a step needs for
activations, measured rather than estimated. On Ascend/GPU ``mindspore.runtime.max_memory_allocated``
is also read; the CPU build has no allocator statistics (it returns 0).
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Dict, List, Optional

import mindspore as ms
from mindspore import Parameter, Tensor, ops

_CURRENT: List["ActivationMeter"] = []


def current_meter() -> Optional["ActivationMeter"]:
    return _CURRENT[-1] if _CURRENT else None


def _key_and_bytes(t: Tensor):
    try:
        return t.data_ptr(), int(t.nbytes)
    except Exception:   # a tensor without storage yet: count it as its own buffer
        return ("id", id(t)), int(t.nbytes)


class _Held:
    """What the hook returns for a saved tensor: the tensor, and the release of its count."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class ActivationMeter:
    """Bytes held for backward: ``live`` now, ``peak`` so far, ``host_live``/``host_peak`` for swapped
    copies, ``param_bytes`` (weights saved by ops), ``packs`` (tensors saved), ``recomputed`` (Counter
    of recompute-unit name -> backward recomputations) and ``swapped`` (unit -> bytes sent to host)."""

    def __init__(self, model=None):
        self._params = {p.data_ptr() for p in model.get_parameters()} if model is not None else set()
        self._refs: Dict = {}
        self._host: Dict = {}
        self.live = self.peak = 0
        self.host_live = self.host_peak = 0
        self.param_bytes = 0
        self.packs = 0
        self.recomputed: Counter = Counter()
        self.swapped: Counter = Counter()
        self._ctx = None

    # ---- device-side accounting --------------------------------------------------------------
    def add(self, key, nbytes: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            self._refs[key] = [nbytes, 1]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            entry[1] += 1

    def release(self, key) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._refs[key]

    def hold(self, tensors) -> List:
        """Count ``tensors`` (a recompute unit's kept inputs) until the returned keys are released."""
        keys = []
        for t in tensors:
            if isinstance(t, Tensor) and not isinstance(t, Parameter):
                key, nbytes = _key_and_bytes(t)
                if key in self._params:
                    continue
                self.add(key, nbytes)
                keys.append(key)
        return keys

    # ---- host-side accounting (swap) --------------------------------------------------------------
    def add_host(self, holder, nbytes: int, unit: str) -> None:
        self.host_live += nbytes
        self.host_peak = max(self.host_peak, self.host_live)
        self.swapped[unit] += nbytes
        weakref.finalize(holder, self._drop_host, nbytes)

    def _drop_host(self, nbytes: int) -> None:
        self.host_live -= nbytes

    # ---- the hooks ---------------------------------------------------------------------------------
    def _pack(self, t):
        self.packs += 1
        held = _Held(t)
        key, nbytes = _key_and_bytes(t)
        if isinstance(t, Parameter) or key in self._params:
            self.param_bytes += nbytes
            return held
        self.add(key, nbytes)
        weakref.finalize(held, self.release, key)
        return held

    @staticmethod
    def _unpack(held):
        return held.tensor

    def __enter__(self) -> "ActivationMeter":
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise RuntimeError("ActivationMeter counts saved tensors through PyNative saved_tensors_hooks; under "
                               "GRAPH_MODE / ms.jit MindSpore does not call Python hooks while running")
        self._ctx = ms.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.remove(self)
        self._ctx.__exit__(*exc)

    def measure(self, fn, *args, weights=None) -> Dict[str, int]:
        """Forward of ``fn(*args)`` (a scalar loss) under ``ms.vjp``, then its backward. Returns
        ``{"held_after_forward", "peak", "host_after_forward", "host_peak", "param_bytes", "packs"}``;
        the gradients are in ``self.grads``."""
        with self:
            out, vjp_fn = ms.vjp(fn, *args, weights=weights)
            held, host = self.live, self.host_live
            self.loss = out
            self.grads = vjp_fn(ops.ones_like(out))
        return {"held_after_forward": held, "peak": self.peak, "host_after_forward": host,
                "host_peak": self.host_peak, "param_bytes": self.param_bytes, "packs": self.packs}


def allocator_peak() -> Optional[int]:
    """``mindspore.runtime.max_memory_allocated()`` where the device reports it (None on CPU)."""
    try:
        value = int(ms.runtime.max_memory_allocated())
    except Exception:
        return None
    return value or None
