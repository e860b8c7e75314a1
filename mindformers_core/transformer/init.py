"""Deterministic weight initialization keyed by a parameter's *global* name.

Each weight is drawn from its own generator seeded with (MindSpore's global seed, its global
name, e.g. ``decoder.layers.2.self_attention.linear_q.weight``). So the weights do not depend on
the order in which cells are built: a pipeline stage that builds only layers 2-3 gets exactly
the weights layers 2-3 have in the full model, and the same seed always gives the same model.
Layers name their parameters by their global ``layer_number``, not their position in a stage.
"""
from __future__ import annotations

import zlib
from typing import Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor


def global_seed() -> int:
    """``mindspore.set_seed``'s value, 0 when no seed was set."""
    seed = ms.get_seed()
    return 0 if seed is None else int(seed)


def normal_array(key: str, shape: Sequence[int], std: float) -> np.ndarray:
    rng = np.random.default_rng([global_seed(), zlib.crc32(key.encode("utf-8"))])
    return rng.normal(0.0, std, size=tuple(shape)).astype(np.float32)


def normal_parameter(key: str, shape: Tuple[int, ...], std: float, dtype, name: str = "weight") -> Parameter:
    return Parameter(Tensor(normal_array(key, shape, std), dtype), name=name)


def constant_parameter(value: float, shape: Tuple[int, ...], dtype, name: str) -> Parameter:
    return Parameter(Tensor(np.full(shape, value, np.float32), dtype), name=name)


def init_weights(cell, prefix: str, std: float) -> None:
    """Redraw every ``normal_init_params`` parameter of ``cell``'s sub-cells, keyed by
    ``prefix`` + the sub-cell path, with the sub-cell's ``init_std`` if it has one. Cells own
    fixed-value parameters (norm weights, biases) and list only their random ones in
    ``normal_init_params``."""
    for path, sub in cell.cells_and_names():
        for pname in getattr(sub, "normal_init_params", ()):
            param = getattr(sub, pname, None)
            if param is None:
                continue
            key = ".".join(p for p in (prefix, path, pname) if p)
            data = normal_array(key, param.shape, getattr(sub, "init_std", std))
            param.set_data(Tensor(data, param.dtype))
