"""The per-step mixture-of-experts report: expert load and load-balancing loss, and the expert-bias update.

Every forward of a MoE layer adds its routing counts to its router's ``tokens_per_expert`` and its
load-balancing loss to its probe's ``aux_sum`` (``transformer/moe.py``; one count of ``forwards``
each). After a step the monitor sums them over the ranks (one all-reduce of a small vector), turns
them into per-micro-batch values of the global batch, moves each router's expert bias when
``moe_router_enable_expert_bias`` (the same update on every rank: the counts are global) and resets
them. ``loss.jsonl`` gets ``expert_load`` (tokens per expert per MoE layer), ``expert_load_min``,
``expert_load_max`` and ``aux_loss``; the console line ``experts <min>..<max> tok  aux <value>``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from ..distributed.comm.kernels import AllReduceKernel
from ..distributed.process_group import world_group
from ..transformer.moe import AuxLossProbe, expert_bias_update, routers_of


class MoEMonitor:
    """Reads, reduces and resets the MoE counters of ``model`` (one pipeline stage: the whole model)."""

    def __init__(self, model, config):
        self.routers = [r for _, r in routers_of(model)]
        self.probes = [c for _, c in model.cells_and_names() if isinstance(c, AuxLossProbe)]
        dp, cp, tp = config.data_parallel_size, config.context_parallel_size, config.tensor_model_parallel_size
        self.world = dp * cp * tp
        # ranks holding the same tokens count them again: tensor parallel without sequence parallel
        self.replication = 1 if config.sequence_parallel else tp
        self.reduce = AllReduceKernel(world_group(), "sum") if self.world > 1 else None
        self.reset()

    def __bool__(self) -> bool:
        return bool(self.routers)

    def reset(self) -> None:
        for cell in self.routers + self.probes:
            for p in (getattr(cell, "tokens_per_expert", None), getattr(cell, "aux_sum", None), cell.forwards):
                if p is not None:
                    ops.assign(p, ops.zeros(p.shape, ms.float32))

    def __call__(self) -> Tuple[Dict[str, Any], str]:
        parts = [r.tokens_per_expert.asnumpy() for r in self.routers] + \
                [np.array([r.forwards.asnumpy() for r in self.routers], np.float32)]
        parts += [np.array([p.aux_sum.asnumpy() for p in self.probes] + [p.forwards.asnumpy() for p in self.probes],
                           np.float32)]
        vec = np.concatenate([np.ravel(x) for x in parts]).astype(np.float32)
        if self.reduce is not None:
            vec = self.reduce(Tensor(vec)).asnumpy()
        n, E = len(self.routers), self.routers[0].num_experts
        counts = vec[:n * E].reshape(n, E) / self.replication
        forwards = np.maximum(vec[n * E:n * E + n] / self.world, 1.0)     # forwards per rank, per layer
        load = counts / forwards[:, None]                                  # tokens per expert per micro-batch
        a = len(self.probes)
        aux_sum, aux_forwards = vec[n * E + n:n * E + n + a], vec[n * E + n + a:]
        aux = float(np.sum(aux_sum / np.maximum(aux_forwards, 1.0))) if a else None
        for router, layer_load in zip(self.routers, load):
            if router.use_bias:
                new = expert_bias_update(router.expert_bias.asnumpy(), layer_load, router.bias_update_rate)
                ops.assign(router.expert_bias, Tensor(new))
        self.reset()
        record: Dict[str, Any] = {"expert_load": np.round(load, 2).tolist(), "expert_load_min": float(load.min()),
                                  "expert_load_max": float(load.max())}
        text = f"experts {load.min():.0f}..{load.max():.0f} tok"
        if aux is not None:
            record["aux_loss"] = aux
            text += f"  aux {aux:.4f}"
        return record, text


def moe_monitor(model, config) -> Optional[MoEMonitor]:
    """A monitor for a model with MoE layers, else None."""
    if not getattr(config, "is_moe", False):
        return None
    monitor = MoEMonitor(model, config)
    return monitor if monitor else None
