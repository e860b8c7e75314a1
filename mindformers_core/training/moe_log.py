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


def _moe_layers(chunks, num_layers):
    """``{global layer index: (router, probe or None)}`` of this rank's model chunks (pipeline stages); the
    multi-token prediction depth k's layer (Cell path ``mtp.layers.<k - 1>``) is layer ``num_layers + k - 1``."""
    out = {}
    for chunk in chunks:
        numbers = getattr(getattr(chunk, "decoder", None), "layer_numbers", None)
        probes = {path.rsplit(".mlp.", 1)[0]: c for path, c in chunk.cells_and_names() if isinstance(c, AuxLossProbe)}
        for path, router in routers_of(chunk):
            layer = path.rsplit(".mlp.", 1)[0]
            if layer.startswith("mtp.layers."):
                out[num_layers + int(layer.split(".")[2])] = (router, probes.get(layer))
                continue
            local = int(layer.rsplit(".", 1)[1])
            out[numbers[local] - 1 if numbers else local] = (router, probes.get(layer))
    return out


class MoEMonitor:
    """Reads, reduces and resets the MoE counters of ``model`` (the whole model, or a list of this rank's
    pipeline stage chunks). Every rank contributes a vector over the whole model's MoE layers (zeros for
    the layers other pipeline stages hold), so the one all-reduce also gathers the stages."""

    def __init__(self, model, config):
        mine = _moe_layers(model if isinstance(model, (list, tuple)) else [model], config.num_layers)
        all_moe = [i for i in range(config.num_layers) if config.is_moe_layer(i + 1)]
        depths = getattr(config, "mtp_depths", 0)       # MTP layers are built like the last layer
        all_moe += [config.num_layers + k for k in range(depths) if config.is_moe_layer(config.num_layers)]
        self.slots = [all_moe.index(i) for i in sorted(mine)]        # this rank's layers among all MoE layers
        self.num_layers, self.num_experts = len(all_moe), config.num_moe_experts
        self.routers = [mine[i][0] for i in sorted(mine)]
        self.probes = [mine[i][1] for i in sorted(mine) if mine[i][1] is not None]
        self.has_aux = config.moe_aux_loss_coeff > 0 and config.moe_router_load_balancing_type != "none"
        dp, cp, tp = config.data_parallel_size, config.context_parallel_size, config.tensor_model_parallel_size
        self.world = dp * cp * tp
        # ranks holding the same tokens count them again: tensor parallel without sequence parallel
        self.replication = 1 if config.sequence_parallel else tp
        group = world_group()     # pipeline stages too: each layer's counts come from its stage's ranks only
        self.reduce = AllReduceKernel(group, "sum") if group.size > 1 else None
        self.reset()

    def __bool__(self) -> bool:
        return self.num_layers > 0

    def reset(self) -> None:
        for cell in self.routers + self.probes:
            for p in (getattr(cell, "tokens_per_expert", None), getattr(cell, "aux_sum", None), cell.forwards):
                if p is not None:
                    ops.assign(p, ops.zeros(p.shape, ms.float32))

    def __call__(self) -> Tuple[Dict[str, Any], str]:
        n, E = self.num_layers, self.num_experts
        a = n if self.has_aux else 0
        vec = np.zeros((n * E + n + 2 * a,), np.float32)     # counts, router forwards, aux sums, aux forwards
        for slot, r in zip(self.slots, self.routers):
            vec[slot * E:(slot + 1) * E] = r.tokens_per_expert.asnumpy()
            vec[n * E + slot] = r.forwards.asnumpy()
        probe_slots = self.slots if a else []
        for slot, p in zip(probe_slots, self.probes):
            vec[n * E + n + slot] = p.aux_sum.asnumpy()
            vec[n * E + n + a + slot] = p.forwards.asnumpy()
        if self.reduce is not None:
            vec = self.reduce(Tensor(vec)).asnumpy()
        counts = vec[:n * E].reshape(n, E) / self.replication
        forwards = np.maximum(vec[n * E:n * E + n] / self.world, 1.0)     # forwards per rank, per layer
        load = counts / forwards[:, None]                                  # tokens per expert per micro-batch
        aux_sum, aux_forwards = vec[n * E + n:n * E + n + a], vec[n * E + n + a:]
        aux = float(np.sum(aux_sum / np.maximum(aux_forwards, 1.0))) if a else None
        for router, layer_load in zip(self.routers, load[self.slots]):
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
    """A monitor for a model (or this rank's pipeline stage chunks) with MoE layers, else None (also
    for a pipeline rank holding none: it still joins the all-reduce through an empty monitor)."""
    if not getattr(config, "is_moe", False):
        return None
    monitor = MoEMonitor(model, config)
    return monitor if monitor else None
