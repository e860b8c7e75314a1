"""Rows of a MindFormers name table that are not a plain rename (``models.state_dict.NameRule``): a part of a fused
tensor, and one projection of MindFormers' stacked routed experts. Both can read just a region of our tensor,
as ``models/state_dict.py``'s rules do, so a rank of a parallel job reads only what it holds. Pure NumPy.

- :class:`FusedRule`: MindFormers stores some of our tensors fused along the output dim, in ``(out, in)``
  orientation: rows grouped as ``groups x (size of part 0, size of part 1, ...)``. Our tensor is part ``part``
  (``(in, out)``, transposed; 1-D biases are not). The layouts:

  ========================================  ==============================  ==========================
  MindFormers tensor                        parts                           sizes per group
  ========================================  ==============================  ==========================
  ``linear_qkv`` / ``w_qkv`` (grouped)      q, k, v                         n_rep*head_dim, head_dim, head_dim
  ``linear_qkv`` (contiguous)               q, k, v                         (groups 1) whole q, k, v
  ``linear_fc1`` / ``w_gate_hidden``        gate, up (row-interleaved)      1, 1
  ``linear_fc1`` (contiguous)               gate, up                        (groups 1) f, f
  MLA ``linear_qkv``                        q_down (or q), kv_down          (groups 1) their widths
  ========================================  ==============================  ==========================

  ``sizes`` None means equal parts of our width with one group (the contiguous gate|up).

- :class:`ExpertsRule`: MindFormers' routed experts ``experts.weight1`` ``(E*in, parts*out)`` (each expert's
  gate then up side by side) and ``experts.weight2`` ``(E*ffn, h)``; ours are ``(E, in, out)`` per projection,
  not transposed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..state_dict import READ_BLOCK_BYTES, PatternPairRule, cast_into, read_into

SMALL_RUN_BYTES = 1 << 20      # parts narrower than this are read a block of whole groups at a time


@dataclass(frozen=True)
class FusedRule(PatternPairRule):
    """Our tensor ``ours_pattern`` is part ``part`` of the MindFormers tensor ``hf_pattern`` (``hf`` in the Rule
    interface: "the other side"; see the module doc). ``sizes``: rows of each part in one group (None: ``nparts``
    equal parts of our width, one group)."""
    part: int
    sizes: Optional[Tuple[int, ...]] = None
    nparts: int = 2
    transpose: bool = True

    # --------------------------------------------------------------- geometry
    def _width(self, shape) -> int:
        return int(shape[-1] if self.transpose else shape[0])

    def geometry(self, shape) -> Tuple[Tuple[int, ...], int, int, int]:
        """(sizes, groups, rows per group, offset of our part in a group) for our tensor of ``shape``."""
        width = self._width(shape)
        sizes = tuple(self.sizes) if self.sizes is not None else (width,) * self.nparts
        size = sizes[self.part]
        if size <= 0 or width % size:
            raise ValueError(f"{self.ours_pattern}: width {width} is not a whole number of groups of {size} rows of "
                             f"{self.hf_pattern}")
        return sizes, width // size, sum(sizes), sum(sizes[:self.part])

    def mf_shape(self, shape) -> Tuple[int, ...]:
        sizes, groups, per, _ = self.geometry(shape)
        return (groups * per, int(shape[0])) if self.transpose else (groups * per,)

    # --------------------------------------------------------------- Rule
    def hf_shapes(self, fields, shape):
        return {self.hf_pattern.format(**fields): self.mf_shape(shape)}

    def to_hf(self, fields, array):
        """Not this rule's job: the Rule interface returns whole other-side tensors, and our tensor is only one part
        of the fused one; ``MFAdapter.to_hf`` allocates it once and each part writes itself in with :meth:`place`."""
        raise NotImplementedError("FusedRule: write the fused tensor with place() (MFAdapter.to_hf)")

    def from_hf(self, fields, arrays):
        full = np.asarray(arrays[0])
        if self.sizes is None:                 # equal parts: our width is the part's share
            width = full.shape[0] // self.nparts
        else:                                  # whole groups of sum(sizes) rows: ours is one part of each
            width = full.shape[0] // sum(self.sizes) * self.sizes[self.part]
        shape = (full.shape[1], width) if self.transpose else (width,)
        return self.read(fields, shape, tuple((0, n) for n in shape), lambda n, s: full[s])

    def place(self, fields, array: np.ndarray, target: np.ndarray) -> None:
        """Write our ``array`` into its rows of the fused MindFormers array ``target``."""
        sizes, groups, per, off = self.geometry(array.shape)
        size = sizes[self.part]
        rows = np.asarray(array).T if self.transpose else np.asarray(array)
        view = target.reshape((groups, per) + target.shape[1:])
        view[:, off:off + size] = rows.reshape((groups, size) + rows.shape[1:])

    def read(self, fields, shape, region, reader, out=None):
        name = self.hf_pattern.format(**fields)
        sizes, groups, per, off = self.geometry(shape)
        size = sizes[self.part]
        (lo, hi) = region[-1] if self.transpose else region[0]
        inner = (slice(*region[0]),) if self.transpose else ()
        in_len = region[0][1] - region[0][0] if self.transpose else 1
        pieces = []                        # (our index start, array of (n, in) rows) when out is None

        def put(j0: int, rows: np.ndarray) -> None:
            if out is None:
                pieces.append(rows)
            elif self.transpose:
                cast_into(rows.T, out[:, j0 - lo:j0 - lo + rows.shape[0]])
            else:
                cast_into(rows, out[j0 - lo:j0 - lo + rows.shape[0]])

        itemsize = out.itemsize if out is not None else 4
        if size * in_len * itemsize >= SMALL_RUN_BYTES or groups == 1:
            for g in range(lo // size, (hi - 1) // size + 1):       # one contiguous run of rows per group
                j0, j1 = max(lo, g * size), min(hi, (g + 1) * size)
                first = g * per + off + j0 - g * size
                rows_slices = (slice(first, first + j1 - j0),) + inner
                if out is not None and self.transpose:
                    read_into(reader, name, rows_slices, True, out[:, j0 - lo:j1 - lo])
                else:
                    put(j0, np.asarray(reader(name, rows_slices)))
        else:                              # narrow parts: whole groups a block at a time, our rows picked out
            g_lo, g_hi = lo // size, (hi - 1) // size + 1
            step = max(1, READ_BLOCK_BYTES // max(1, per * in_len * itemsize))
            for ga in range(g_lo, g_hi, step):
                gb = min(g_hi, ga + step)
                block = np.asarray(reader(name, (slice(ga * per, gb * per),) + inner))
                mine = block.reshape((gb - ga, per) + block.shape[1:])[:, off:off + size]
                mine = mine.reshape(((gb - ga) * size,) + block.shape[1:])
                a, b = max(lo, ga * size), min(hi, gb * size)
                put(a, mine[a - ga * size:b - ga * size])
        if out is not None:
            return out
        rows = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        return np.ascontiguousarray(rows.T if self.transpose else rows)


@dataclass(frozen=True)
class ExpertsRule(PatternPairRule):
    """Our ``(E, a, b)`` routed-expert tensor ``ours_pattern`` <- part ``part`` of ``nparts`` of MindFormers'
    ``(E*a, nparts*b)`` ``hf_pattern`` (expert e's rows ``e*a ...``, our part's columns ``part*b ...``)."""
    part: int = 0
    nparts: int = 1

    def hf_shapes(self, fields, shape):
        e, a, b = (int(d) for d in shape)
        return {self.hf_pattern.format(**fields): (e * a, self.nparts * b)}

    def to_hf(self, fields, array):
        """Not this rule's job (as :meth:`FusedRule.to_hf`): ``MFAdapter.to_hf`` writes each part with :meth:`place`."""
        raise NotImplementedError("ExpertsRule: write the stacked tensor with place() (MFAdapter.to_hf)")

    def from_hf(self, fields, arrays):
        """Not answerable from the arrays alone: the expert count comes from our tensor's shape, which
        :meth:`read` is given (every load goes through ``read``)."""
        raise NotImplementedError("ExpertsRule: the expert count comes from our shape; use read()")

    def place(self, fields, array: np.ndarray, target: np.ndarray) -> None:
        e, a, b = array.shape
        target.reshape(e, a, self.nparts * b)[:, :, self.part * b:(self.part + 1) * b] = array

    def read(self, fields, shape, region, reader, out=None):
        name = self.hf_pattern.format(**fields)
        e, a, b = (int(d) for d in shape)
        (e0, e1), (a0, a1), (b0, b1) = region
        cols = slice(self.part * b + b0, self.part * b + b1)
        if out is None:
            return np.stack([np.asarray(reader(name, (slice(k * a + a0, k * a + a1), cols))) for k in range(e0, e1)])
        for k in range(e0, e1):
            read_into(reader, name, (slice(k * a + a0, k * a + a1), cols), False, out[k - e0])
        return out


__all__ = ["FusedRule", "ExpertsRule"]
