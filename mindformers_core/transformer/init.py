"""Deterministic weight initialization keyed by a parameter's *global* name.

Each weight is drawn from its own generator seeded with (MindSpore's global seed, its global
name, e.g. ``decoder.layers.2.self_attention.linear_q.weight``). So the weights do not depend on
the order in which cells are built: a pipeline stage that builds only layers 2-3 gets exactly
the weights layers 2-3 have in the full model, and the same seed always gives the same model.
Layers name their parameters by their global ``layer_number``, not their position in a stage.

When every weight is about to be overwritten (``from_pretrained``: a Hugging Face folder's weights), drawing
them first is wasted time (hundreds of millions of normals): build the model inside :func:`deferred_init`,
where a random parameter is made as zeros and only remembered with its key; load; then
:meth:`DeferredInit.materialize` draws, exactly as without deferral, every one that was not loaded.
"""
from __future__ import annotations

import contextlib
import threading
import zlib
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor
from mindspore.common.initializer import initializer


def global_seed() -> int:
    """``mindspore.set_seed``'s value, 0 when no seed was set."""
    seed = ms.get_seed()
    return 0 if seed is None else int(seed)


def normal_array(key: str, shape: Sequence[int], std: float) -> np.ndarray:
    rng = np.random.default_rng([global_seed(), zlib.crc32(key.encode("utf-8"))])
    return rng.normal(0.0, std, size=tuple(shape)).astype(np.float32)


class DeferredInit:
    """The random parameters built inside :func:`deferred_init`, made as zeros: ``pending`` maps each one's id
    to ``(parameter, key, std)``, the draw it would have had (the latest: ``init_weights`` redraws with the
    global name)."""

    def __init__(self):
        self.pending: Dict[int, Tuple[Parameter, str, float]] = {}

    def defer(self, param: Parameter, key: str, std: float) -> None:
        self.pending[id(param)] = (param, key, std)

    def materialize(self, loaded: Iterable[Parameter] = ()) -> list:
        """Draw every pending parameter not in ``loaded`` (by identity), with the key and std it would have
        been drawn with and at its shape (call it before the model is sharded); returns those drawn."""
        done = {id(p) for p in loaded}
        drawn = []
        for pid, (param, key, std) in list(self.pending.items()):
            if pid not in done:
                param.set_data(Tensor(normal_array(key, param.shape, std), param.dtype))
                drawn.append(param)
        self.pending.clear()
        return drawn


_STATE = threading.local()


def _deferred() -> Optional[DeferredInit]:
    return getattr(_STATE, "deferred", None)


@contextlib.contextmanager
def deferred_init() -> Iterator[DeferredInit]:
    """Inside: :func:`normal_parameter` and :func:`init_weights` draw nothing; the parameters are zeros and
    are recorded in the yielded :class:`DeferredInit`, whose ``materialize(loaded)`` draws the ones not
    loaded. Fixed-value parameters (:func:`constant_parameter`) and direct :func:`normal_array` calls are not
    affected. Not nestable."""
    if _deferred() is not None:
        raise RuntimeError("deferred_init() is already active in this thread")
    state = _STATE.deferred = DeferredInit()
    try:
        yield state
    finally:
        _STATE.deferred = None


def _zeros(shape: Sequence[int], dtype) -> Tensor:
    """Zeros whose pages are only touched when written (MindSpore's zeros initializer: no copy)."""
    return initializer("zeros", tuple(int(d) for d in shape), dtype)


def normal_parameter(key: str, shape: Tuple[int, ...], std: float, dtype, name: str = "weight") -> Parameter:
    deferred = _deferred()
    if deferred is not None:
        param = Parameter(_zeros(shape, dtype), name=name)
        deferred.defer(param, key, std)
        return param
    return Parameter(Tensor(normal_array(key, shape, std), dtype), name=name)


def constant_parameter(value: float, shape: Tuple[int, ...], dtype, name: str) -> Parameter:
    return Parameter(Tensor(np.full(shape, value, np.float32), dtype), name=name)


def init_weights(cell, prefix: str, std: float) -> None:
    """Redraw every ``normal_init_params`` parameter of ``cell``'s sub-cells, keyed by
    ``prefix`` + the sub-cell path, with the sub-cell's ``init_std`` if it has one. Cells own
    fixed-value parameters (norm weights, biases) and list only their random ones in
    ``normal_init_params``. Inside :func:`deferred_init` the draws are only recorded."""
    deferred = _deferred()
    for path, sub in cell.cells_and_names():
        for pname in getattr(sub, "normal_init_params", ()):
            param = getattr(sub, pname, None)
            if param is None:
                continue
            key = ".".join(p for p in (prefix, path, pname) if p)
            if deferred is not None:
                deferred.defer(param, key, getattr(sub, "init_std", std))
                continue
            data = normal_array(key, param.shape, getattr(sub, "init_std", std))
            param.set_data(Tensor(data, param.dtype))
