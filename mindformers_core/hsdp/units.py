"""Level3 per unit: a unit's sharded parameters are all-gathered right before the unit runs
forward and again right before its backward, and cut back to this rank's shard right after each.

A *unit* is a sub-Cell of the wrapped model: by default every Cell that directly owns a sharded
parameter (an ``nn.Dense``, an embedding...); ``units=`` patterns (``"decoder.layers.*"``) group a
whole block into one unit (one bucketed all-gather per call instead of one per leaf). Cell hooks
do the work, so the model code is untouched:

* forward pre-hook: gather (every sharded parameter of the unit, plus any sharded Parameter
  passed to it as an argument, e.g. a tied embedding weight handed to the output layer: a Cell marked
  ``takes_parameter_arguments``, which owns no weight, is a unit of its own for that reason);
* forward hook: shrink back to the shards;
* backward pre-hook: gather again (the autograd tape reads a Parameter's data when the backward
  runs, not a copy saved by the forward: the full weights do not outlive the forward);
* backward hook: shrink back.

``set_data`` swaps the parameter's storage in place; the pending kernels that still read the
full buffer are waited for first (PyNative dispatches asynchronously).

Under ``ms.jit`` a graph cannot change a Parameter's shape, so in ``jit`` mode each unit becomes
a compiled *island*: the parent calls a Cell that runs the unit's graph with the unit's
Parameters as arguments (a graph reads passed Parameters at every call), and the hooks run
around it in PyNative. The rest of the step (reduction, clipping, update) is one compiled graph.
"""
from __future__ import annotations

import fnmatch
from typing import Dict, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Parameter, mint, nn
from mindspore.common.api import _no_grad, _pynative_executor

from ..sharding.annotations import replaces_inner, takes_parameter_arguments
from ..sharding.boundary import inner_attribute


def _wait_for_pending_kernels() -> None:
    """PyNative launches kernels asynchronously: a kernel may still read a buffer we drop."""
    _pynative_executor.sync()


def select_units(network: nn.Cell, sharded: Dict[int, Parameter], patterns: Optional[Sequence[str]]
                 ) -> List[Tuple[str, nn.Cell]]:
    """(name, Cell) of every unit: the topmost Cells whose name matches one of ``patterns``, then
    every Cell holding a sharded parameter not inside one of them (all holders of a shared one; the network itself when it
    owns one directly; the caller of the owner when it computes in the owner's place without
    calling it, like parallelize's vocab-parallel lookup), and every Cell handed a Parameter as an argument
    (``takes_parameter_arguments``: the tied output layer, whose hooks gather the embedding table it reads) not
    inside a unit. Raises ValueError when a pattern matches nothing."""
    named = list(network.cells_and_names())
    units: List[Tuple[str, nn.Cell]] = []
    covered = set()
    for pattern in patterns or ():
        hits = [(n, c) for n, c in named if n and fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            names = [n for n, _ in named if n]
            raise ValueError(f"hsdp: units pattern {pattern!r} matches no sub-Cell; names look like "
                             f"{names[:6]}")
        for name, cell in hits:
            if id(cell) in covered or any(name.startswith(u + ".") for u, _ in units):
                continue
            units.append((name, cell))
            covered.update(id(p) for p in cell.get_parameters())
    parent = {id(child): (n, c) for n, c in named for child in c._cells.values() if child is not None}
    # a Parameter two Cells hold (multi-token prediction's head on the main output layer's weight) makes both
    # units: each gathers it for its own call (the open count keeps one full copy while either is open)
    for name, cell in named:
        own = [p for p in cell._params.values() if p is not None and id(p) in sharded and id(p) not in covered]
        if not own:
            continue
        unit_name, unit = name, cell
        # a Cell computing in place of its child (parallelize's local kernels) never calls it:
        # the hooks belong on the caller
        while id(unit) in parent and replaces_inner(parent[id(unit)][1]):
            unit_name, unit = parent[id(unit)]
        if all(u is not unit for _, u in units):
            units.append((unit_name, unit))
    for name, cell in named:
        if takes_parameter_arguments(cell) and all(u is not cell and not name.startswith(n + ".") for n, u in units):
            units.append((name, cell))
    return units


class Island(nn.Cell):
    """``jit`` mode: calls ``inner``'s compiled graph with ``inner``'s Parameters as arguments."""

    def __init__(self, inner: nn.Cell):
        super().__init__(auto_prefix=False)
        self.inner = inner
        params = tuple(inner.get_parameters())
        n = len(params)

        def call(*args):
            return inner(*args[:len(args) - n])
        object.__setattr__(self, "_compiled", ms.jit(call))
        object.__setattr__(self, "_island_params", params)

    __getattr__ = inner_attribute

    def construct(self, *args):
        return self._compiled(*args, *self._island_params)


class UnitGathering:
    """The hooks of one ``HSDPCell`` at level3 (see the module docstring).

    ``held_bytes`` / ``peak_held_bytes``: bytes of full parameters held beyond their shards right
    now / at most since ``reset_peak()`` -- the number a level3 memory claim rests on."""

    def __init__(self, wrapped, patterns: Optional[Sequence[str]] = None):
        self.wrapped = wrapped
        self.sharded = {id(p): p for p, _ in wrapped.sharded_params()}
        self.units = select_units(wrapped.network, self.sharded, patterns)
        self.open_count: Dict[int, int] = {}
        self.saved_shards: Dict[int, object] = {}
        self.held_bytes = self.peak_held_bytes = 0
        self.gathers = 0
        self._islands = False
        self._handles: Dict[int, list] = {}
        # per unit call: the parameters opened by its forward, reopened by its backward (a stack:
        # backward runs the calls in reverse order)
        self._calls: Dict[int, List[Tuple[int, ...]]] = {}
        for _, cell in self.units:
            self._hook(cell)

    # ---- state of one parameter ---------------------------------------------------------------
    def _members(self, cell, inputs) -> Tuple[int, ...]:
        ids = [id(p) for p in cell.get_parameters() if id(p) in self.sharded]
        ids += [id(x) for x in inputs if isinstance(x, Parameter) and id(x) in self.sharded]
        return tuple(dict.fromkeys(ids))

    def _gathered_bytes(self, p) -> int:
        """Bytes a gathered parameter holds beyond its shard."""
        plan = self.wrapped.plan_of(p)
        if not hasattr(plan, "shard_shape"):      # a stand-in plan (tests): the dp shard size
            return (plan.numel - plan.numel // self.wrapped.shard_size) * p.itemsize
        shard = 1
        for d in plan.shard_shape:     # the parameter's own domain's shard (expert params: over edp)
            shard *= d
        return (plan.numel - shard) * p.itemsize

    def _open(self, ids: Sequence[int]) -> None:
        need = [i for i in ids if self.open_count.get(i, 0) == 0]
        for i in ids:
            self.open_count[i] = self.open_count.get(i, 0) + 1
        if not need:
            return
        params = [self.sharded[i] for i in need]
        gather = self.wrapped.unit_gather(params)
        with _no_grad():   # the gather is not part of the model: keep it off the autograd tape
            fulls = gather(tuple(params))
            # a real copy of the shard (x * 1 is exact): ``p.value()`` answers with PyNative's cached
            # abstract of ``p`` (stale after a reshape in place), ``ops.identity`` aliases ``p``'s
            # storage and ``Parameter.copy`` keeps every clone alive in ``p.param_info``
            shards = [mint.mul(p, 1) for p in params]
        self.gathers += 1
        _wait_for_pending_kernels()   # the gather and the copies read ``p`` before it is swapped
        for p, full, shard in zip(params, fulls, shards):
            self.saved_shards[id(p)] = shard
            p.set_data(full, slice_shape=True)
            self.held_bytes += self._gathered_bytes(p)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def _close(self, ids: Sequence[int]) -> None:
        done = []
        for i in ids:
            self.open_count[i] -= 1
            if self.open_count[i] == 0:
                done.append(i)
        if not done:
            return
        _wait_for_pending_kernels()
        for i in done:
            p = self.sharded[i]
            p.set_data(self.saved_shards.pop(i), slice_shape=True)
            self.held_bytes -= self._gathered_bytes(p)

    def reset_peak(self) -> None:
        self.peak_held_bytes = self.held_bytes

    def check_closed(self) -> None:
        """After a step every parameter must be a shard again (a backward hook that did not fire,
        e.g. a unit whose output got no gradient, is caught here and the parameter shrunk)."""
        left = [i for i, n in self.open_count.items() if n > 0]
        if left:
            for i in left:
                self.open_count[i] = 1
            self._close(left)
        for calls in self._calls.values():   # forward-only calls leave entries; the hooks hold these lists
            calls.clear()

    # ---- hooks ----------------------------------------------------------------------------------
    def _active(self) -> bool:
        return not self.wrapped.holds_full_params   # inside ``unsharded()`` everything is full already

    def _hook(self, cell) -> None:
        calls = self._calls.setdefault(id(cell), [])

        def forward_pre(c, inputs):
            if self._active():
                ids = self._members(c, inputs)
                calls.append(ids)
                self._open(ids)

        def forward_post(c, inputs, outputs):
            if self._active() and calls:
                self._close(calls[-1])

        def backward_pre(c, grad_outputs):
            if self._active() and calls:
                self._open(calls[-1])

        def backward_post(c, grad_inputs, grad_outputs):
            if self._active() and calls:
                self._close(calls.pop())

        self._handles[id(cell)] = [cell.register_forward_pre_hook(forward_pre),
                                   cell.register_forward_hook(forward_post),
                                   cell.register_backward_pre_hook(backward_pre),
                                   cell.register_backward_hook(backward_post)]

    # ---- jit ----------------------------------------------------------------------------------
    def make_islands(self) -> None:
        """Swap every unit for an ``Island`` in its parent (once); the hooks move with it."""
        if self._islands:
            return
        network = self.wrapped.network
        names = {id(p): p.name for p in network.get_parameters()}
        parents = {}
        for _, cell in network.cells_and_names():
            for key, child in cell._cells.items():
                if child is not None:
                    parents[id(child)] = (cell, key)
        for k, (name, cell) in enumerate(self.units):
            if cell is network:
                raise ValueError("hsdp level3 jit: the wrapped Cell itself owns a sharded parameter, so it "
                                 "would be one unit and cannot be compiled apart from its caller; move the "
                                 "parameter into a sub-Cell, or use mode='pynative'")
            island = Island(cell)
            parent, key = parents[id(cell)]
            parent._cells[key] = island
            if key in parent.__dict__:
                object.__setattr__(parent, key, island)
            if isinstance(parent.__dict__.get("cell_list"), list):   # nn.SequentialCell calls its copy
                object.__setattr__(parent, "cell_list", list(parent._cells.values()))
            for handle in self._handles.pop(id(cell)):   # no hooks inside a graph
                handle.remove()
            self._calls.pop(id(cell), None)
            self._hook(island)
            self.units[k] = (name, island)
        for p in network.get_parameters():
            if id(p) in names:
                p.name = names[id(p)]
        self._islands = True
