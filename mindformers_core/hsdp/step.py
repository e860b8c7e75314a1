"""The Cells of an hsdp training step; the same Cells run eagerly (PyNative) or under ``ms.jit``.

* ``Collective``: a forward-only collective kernel that counts its calls in a Parameter (the
  count is exact in both modes: the graph itself increments it);
* ``DataParallelGradReducer``: gradient (and loss) reduction over the data-parallel group, scaled by
  ``1 / (dp size * accumulate_grad_step)``. Tensors are bucketed, so one step issues one
  all-reduce over the dp group (unsharded parameters, every parameter at level1, and the loss)
  and, at level2/3, one reduce-scatter over the shard group plus one all-reduce over the
  replica group for all sharded parameters;
* ``ShardedUpdate``: the optimizer on this rank's shard of each sharded parameter, then one
  bucketed all-gather of the updated shards into the full parameters (level1/2), or the new
  shards returned (level3: the caller keeps them and drops the full parameters);
* ``Gather``: level3's bucketed all-gather of the shards before a step;
* ``Accumulate`` / ``Drain``: gradient accumulation in local buffers, no communication;
* ``HsdpReduce``: drain, model-parallel sum, data-parallel reduction: the ``reduce`` of the step's
  ``optim.GradientUpdate`` (reduce -> clip -> guard -> ``ShardedUpdate``).

Buckets: a parameter split on dim ``d`` is moved to ``d``-first and viewed as ``(S, -1)``: row
``j`` is shard ``j``. Rows of all sharded parameters are concatenated, so one reduce-scatter /
all-gather on dim 0 serves them all. Everything rank-dependent (slice offsets, the kernels' rank
flags) is a constant or a Parameter: every rank builds the same graph.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ..distributed.comm import kernels as K
from ..distributed.process_group import ProcessGroup
from .plan import ParamPlan


class Collective(nn.Cell):
    """``kernel(x)``, adding 1 to ``counter`` each time it runs."""

    def __init__(self, kernel: nn.Cell, counter: Parameter):
        super().__init__(auto_prefix=False)
        self.kernel = kernel
        self.counter = counter
        self.one = Tensor(np.ones((1,), np.float32))

    def construct(self, x):
        y = self.kernel(x)
        return ops.depend(y, ops.assign_add(self.counter, self.one))


class NoCollective(nn.Cell):
    """What a collective over a one-rank group does: nothing (and it is not counted)."""

    def __init__(self):
        super().__init__(auto_prefix=False)

    def construct(self, x):
        return x


class Comm:
    """The collectives of one hsdp wrapper (kernels built once; one-rank groups are identities)."""

    def __init__(self, dp: ProcessGroup, shard: ProcessGroup, replica: ProcessGroup, counter: Parameter):
        def counted(group, kernel):
            return Collective(kernel, counter) if group.size > 1 else NoCollective()
        self.shard_size = shard.size
        self.dp_sum = counted(dp, K.AllReduceKernel(dp, "sum"))
        self.replica_sum = counted(replica, K.AllReduceKernel(replica, "sum"))
        self.reduce_scatter = counted(shard, K.ReduceScatterKernel(shard, 0))
        self.all_gather = counted(shard, K.AllGatherKernel(shard, 0))


class Rows:
    """Static layout of a bucket of sharded tensors viewed as ``(S, -1)`` rows (see module doc)."""

    def __init__(self, plans: Sequence[ParamPlan], shard_size: int):
        self.s = shard_size
        self.perm, self.inverse, self.moved_shard, self.moved_full, self.width = [], [], [], [], []
        for p in plans:
            nd = len(p.shape)
            perm = (p.dim,) + tuple(k for k in range(nd) if k != p.dim)
            self.perm.append(perm)
            self.inverse.append(tuple(int(i) for i in np.argsort(perm)))
            self.moved_shard.append(tuple(p.shard_shape[k] for k in perm))
            self.moved_full.append(tuple(p.shape[k] for k in perm))
            self.width.append(p.numel // shard_size)
        self.offsets = tuple(int(o) for o in np.cumsum([0] + self.width))


def _to_rows(x, perm, s):
    if perm != tuple(range(len(perm))):
        x = ops.transpose(x, perm)
    return x.reshape((s, -1))


def _from_moved(x, inverse):
    if inverse != tuple(range(len(inverse))):
        return ops.transpose(x, inverse)
    return x


class DataParallelGradReducer(nn.Cell):
    """``construct(grads, loss) -> (local gradients, loss)``: full tensors for unsharded
    parameters and at level1, this rank's shard of sharded parameters at level2/3; the loss
    summed over the dp group; everything times ``scale``."""

    def __init__(self, plans: Sequence[ParamPlan], level: str, comm: Comm, scale: float):
        super().__init__(auto_prefix=False)
        self.n = len(plans)
        scatter = [i for i, p in enumerate(plans) if p.sharded and level != "level1"]
        summed = [i for i in range(self.n) if i not in scatter]
        self.scatter, self.summed = tuple(scatter), tuple(summed)
        # where gradient i comes from: (True, k) = k-th scattered, (False, k) = k-th summed
        self.is_scatter = tuple(i in scatter for i in range(self.n))
        self.position = tuple(scatter.index(i) if i in scatter else summed.index(i) for i in range(self.n))
        self.shapes = tuple(tuple(p.shape) for p in plans)
        sizes = [plans[i].numel for i in summed]
        self.sum_offsets = tuple(int(o) for o in np.cumsum([0] + sizes))
        rows = Rows([plans[i] for i in scatter], comm.shard_size)
        self.perm, self.moved_shard = tuple(rows.perm), tuple(rows.moved_shard)
        self.inverse, self.offsets = tuple(rows.inverse), rows.offsets
        self.s = comm.shard_size
        self.scale = float(scale)
        self.dp_sum, self.replica_sum = comm.dp_sum, comm.replica_sum
        self.reduce_scatter = comm.reduce_scatter

    def construct(self, grads, loss):
        # one all-reduce over dp: unsharded (or level1) gradients and the loss, flattened
        flat = ()
        for k in range(len(self.summed)):
            flat = flat + (ops.cast(grads[self.summed[k]], ms.float32).reshape((-1,)),)
        flat = flat + (ops.cast(loss, ms.float32).reshape((1,)),)
        summed = self.dp_sum(ops.concat(flat, 0)) * self.scale
        last = self.sum_offsets[len(self.summed)]
        total_loss = summed[last:last + 1].reshape(())
        # one reduce-scatter over the shard group + one all-reduce over the replicas
        mine = summed
        if len(self.scatter) > 0:
            rows = ()
            for k in range(len(self.scatter)):
                g = ops.cast(grads[self.scatter[k]], ms.float32)
                rows = rows + (_to_rows(g, self.perm[k], self.s),)
            mine = self.replica_sum(self.reduce_scatter(ops.concat(rows, 1))) * self.scale
        out = ()
        for i in range(self.n):
            k = self.position[i]
            if self.is_scatter[i]:
                piece = mine[0, self.offsets[k]:self.offsets[k + 1]].reshape(self.moved_shard[k])
                piece = _from_moved(piece, self.inverse[k])
            else:
                piece = summed[self.sum_offsets[k]:self.sum_offsets[k + 1]].reshape(self.shapes[i])
            out = out + (ops.cast(piece, grads[i].dtype),)
        return out, total_loss


class ShardedUpdate(nn.Cell):
    """``construct(local grads) -> new shards of the level3-sharded parameters`` (empty otherwise).

    The optimizer's states of sharded parameters are shard-shaped (``shard_optimizer``); it sees
    ``narrow(param)`` and the gradient shard. The full parameter is then the concatenation of the
    shard group's updated shards, identical on every replica. ``params_sharded``: level3 with the
    parameters already held as shards (per-unit gathering): they are updated in place.
    """

    def __init__(self, optimizer, plans: Sequence[ParamPlan], level: str, comm: Comm,
                 params_sharded: bool = False, comms: Sequence[Comm] = None, domains: Sequence[int] = None):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.in_place = level == "level3" and params_sharded
        self.n = len(plans)
        self.sharded = tuple(p.sharded for p in plans)
        self.dim = tuple(p.dim if p.sharded else 0 for p in plans)
        self.offset = tuple(p.offset for p in plans)
        self.size = tuple(p.shard_shape[p.dim] if p.sharded else 0 for p in plans)
        self.level1 = level == "level1"
        self.level3 = level == "level3"
        gathered = [i for i, p in enumerate(plans) if p.sharded]
        self.gathered = tuple(gathered)
        comms, domains = _domain_args(comm, comms, domains, len(plans))
        # level1/2 rebuild the full parameters from the updated shards: one bucketed all-gather per domain
        self.rebuild = MultiGather([plans[i] for i in gathered], [domains[i] for i in gathered], comms)

    def construct(self, grads, ok=None):
        params = self.optimizer.parameters
        values = ()
        local = ()
        for i in range(self.n):
            if self.in_place:
                values = values + (params[i],)
                local = local + (grads[i],)
            elif self.sharded[i]:
                values = values + (ops.narrow(params[i], self.dim[i], self.offset[i], self.size[i]),)
                if self.level1:
                    local = local + (ops.narrow(grads[i], self.dim[i], self.offset[i], self.size[i]),)
                else:
                    local = local + (grads[i],)
            else:
                values = values + (params[i],)
                local = local + (grads[i],)
        new = self.optimizer.apply(values, local, ok)
        shards = ()
        for i in range(self.n):
            if self.in_place or not self.sharded[i]:
                ops.assign(params[i], new[i])
            elif self.level3:
                shards = shards + (new[i],)
        if not self.level3 and len(self.gathered) > 0:   # level1/2: rebuild the full parameters
            mine = ()
            for k in range(len(self.gathered)):
                mine = mine + (new[self.gathered[k]],)
            fulls = self.rebuild(mine)
            for k in range(len(self.gathered)):
                ops.assign(params[self.gathered[k]], fulls[k])
        return shards


class Gather(nn.Cell):
    """``construct(shards) -> full tensors``: one bucketed all-gather over the shard group."""

    def __init__(self, plans: Sequence[ParamPlan], comm: Comm):
        super().__init__(auto_prefix=False)
        rows = Rows(plans, comm.shard_size)
        self.n = len(plans)
        self.perm, self.inverse, self.offsets = tuple(rows.perm), tuple(rows.inverse), rows.offsets
        self.moved_full = tuple(rows.moved_full)
        self.all_gather = comm.all_gather

    def construct(self, shards):
        rows = ()
        for k in range(self.n):
            rows = rows + (_to_rows(shards[k], self.perm[k], 1),)
        everyone = self.all_gather(ops.concat(rows, 1))
        out = ()
        for k in range(self.n):
            block = everyone[:, self.offsets[k]:self.offsets[k + 1]].reshape(self.moved_full[k])
            out = out + (_from_moved(block, self.inverse[k]),)
        return out


def _domain_args(comm, comms, domains, n):
    """(comms, per-tensor domain): every tensor in ``comm``'s domain unless ``comms``/``domains`` say."""
    if comms is None:
        return [comm], [0] * n
    return list(comms), [int(d) for d in (domains if domains is not None else [0] * n)]


def _split_by_domain(domains: Sequence[int]):
    """(domain keys in order, per key the tensor indices, per tensor (key position, index in key))."""
    keys = sorted(set(domains))
    members = [tuple(i for i, d in enumerate(domains) if d == key) for key in keys]
    where = tuple((keys.index(d), members[keys.index(d)].index(i)) for i, d in enumerate(domains))
    return keys, tuple(members), where


class MultiGather(nn.Cell):
    """``construct(shards) -> full tensors``: ``Gather`` per domain (each domain's shard group has
    its own collectives: dense parameters over the dp shard group, expert parameters over their
    expert-data-parallel shard group), results in the input order."""

    def __init__(self, plans: Sequence[ParamPlan], domains: Sequence[int], comms: Sequence[Comm]):
        super().__init__(auto_prefix=False)
        keys, self.members, self.where = _split_by_domain(domains)
        self.parts = nn.CellList([Gather([plans[i] for i in m], comms[k]) for k, m in zip(keys, self.members)])
        self.count, self.n = len(keys), len(plans)

    def construct(self, shards):
        outs = ()
        for j in range(self.count):
            mine = ()
            for i in self.members[j]:
                mine = mine + (shards[i],)
            outs = outs + (self.parts[j](mine),)
        out = ()
        for i in range(self.n):
            out = out + (outs[self.where[i][0]][self.where[i][1]],)
        return out


class MultiGradReducer(nn.Cell):
    """``DataParallelGradReducer`` per domain: each gradient reduced over its own parameter's
    domain (expert parameters over the expert-data-parallel group, not the whole dp group); the
    loss is the dp domain's (domain 0: every data-parallel rank)."""

    def __init__(self, plans: Sequence[ParamPlan], domains: Sequence[int], level: str,
                 comms: Sequence[Comm], scale: float):
        super().__init__(auto_prefix=False)
        keys, members, where = _split_by_domain(domains)
        if 0 not in keys:                 # the loss is always reduced over the whole dp group
            keys, members = [0] + keys, ((),) + members
            where = tuple((k + 1, i) for k, i in where)
        self.members, self.where = members, where
        self.parts = nn.CellList([DataParallelGradReducer([plans[i] for i in m], level, comms[k], scale)
                                  for k, m in zip(keys, members)])
        self.count, self.n = len(keys), len(plans)

    def construct(self, grads, loss):
        outs = ()
        total = loss
        for j in range(self.count):
            mine = ()
            for i in self.members[j]:
                mine = mine + (grads[i],)
            reduced, summed = self.parts[j](mine, loss)
            outs = outs + (reduced,)
            if j == 0:
                total = summed
        out = ()
        for i in range(self.n):
            out = out + (outs[self.where[i][0]][self.where[i][1]],)
        return out, total


class HsdpReduce(nn.Cell):
    """``construct(grads, loss) -> (grads, loss)``: hsdp's reduction, the ``reduce`` of its
    ``optim.GradientUpdate``: the accumulated micro-steps added (``drain``), the model-parallel axes
    summed first (``mp_reducer``, a model sharded by ``parallelize``), then ``reducer`` over each
    parameter's data-parallel domain (``MultiGradReducer``: all-reduce, or reduce-scatter to this
    rank's shard); a sharded model held the global loss on every rank, so the dp sum of the loss is
    divided by ``loss_scale`` (the dp size) again."""

    def __init__(self, reducer: nn.Cell, mp_reducer=None, loss_scale: float = 1.0, drain=None):
        super().__init__(auto_prefix=False)
        self.reducer, self.mp_reducer, self.drain = reducer, mp_reducer, drain
        self.loss_scale = float(loss_scale)

    def construct(self, grads, loss):
        if self.drain is not None:
            grads, loss = self.drain(grads, loss)
        if self.mp_reducer is not None:
            grads = self.mp_reducer(grads)
        grads, loss = self.reducer(grads, loss)
        if self.mp_reducer is not None:
            loss = loss / self.loss_scale     # every rank held the global loss: undo the dp sum
        return grads, loss


class Accumulate(nn.Cell):
    """``construct(grads, loss) -> loss``: add to the buffers; no communication."""

    def __init__(self, buffers: ParameterTuple, loss_buffer: Parameter):
        super().__init__(auto_prefix=False)
        self.buffers, self.loss_buffer = buffers, loss_buffer

    def construct(self, grads, loss):
        for i in range(len(self.buffers)):
            ops.assign_add(self.buffers[i], grads[i])
        ops.assign_add(self.loss_buffer, ops.cast(loss, ms.float32).reshape((1,)))
        return loss


class Drain(nn.Cell):
    """``construct(grads, loss) -> (sums with the buffers, summed loss)``; buffers reset to 0."""

    def __init__(self, buffers: ParameterTuple, loss_buffer: Parameter):
        super().__init__(auto_prefix=False)
        self.buffers, self.loss_buffer = buffers, loss_buffer

    def construct(self, grads, loss):
        out = ()
        for i in range(len(self.buffers)):
            total = self.buffers[i] + grads[i]
            ops.assign(self.buffers[i], ops.zeros_like(total))
            out = out + (total,)
        total_loss = self.loss_buffer + ops.cast(loss, ms.float32).reshape((1,))
        ops.assign(self.loss_buffer, ops.zeros_like(total_loss))
        return out, total_loss.reshape(())


def accumulation_buffers(plans: Sequence[ParamPlan], params, tag: str) -> Tuple[ParameterTuple, Parameter]:
    """Zero gradient buffers of the full local shapes, and a loss buffer."""
    bufs = []
    for plan, p in zip(plans, params):
        bufs.append(Parameter(ops.zeros(plan.shape, p.dtype),
                              name=f"hsdp_acc_{tag}.{p.name}", requires_grad=False))
    loss = Parameter(Tensor(np.zeros((1,), np.float32)), name=f"hsdp_acc_loss_{tag}", requires_grad=False)
    return ParameterTuple(bufs), loss
