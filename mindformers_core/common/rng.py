"""The random state PyNative random operators read, as a value that can be saved and put back.

MindSpore draws from two places: the per-kernel seed table of ``mindspore.common.seed`` (what
``ops.dropout`` uses) and the default ``Generator``. Replaying a forward for its backward --
recompute units and the pipeline runtime's recomputing backward -- must reproduce both, or dropout
masks differ between the forward and its recomputation.
"""
from __future__ import annotations

import importlib

from mindspore.common.generator import get_rng_state, set_rng_state

_seed = importlib.import_module("mindspore.common.seed")   # the module (mindspore.common.seed is also a function name)


def rng_snapshot():
    """The random state PyNative random operators read: per-kernel seed table + default generator."""
    return dict(_seed._KERNEL_SEED), get_rng_state()


def rng_restore(state) -> None:
    """Put back a state taken by :func:`rng_snapshot`."""
    table, gen = state
    _seed._KERNEL_SEED.clear()
    _seed._KERNEL_SEED.update(table)
    set_rng_state(gen)
