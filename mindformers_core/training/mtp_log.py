"""The per-step multi-token prediction report: the MTP loss term, logged apart from the loss it is part of.

Every forward of a model with MTP depths adds the term it adds to the loss (``mtp_loss_scaling_factor / depths x
sum_k loss_k``, ``transformer/mtp.py``) to its probe's ``loss_sum`` and 1 to ``forwards``. After a step the monitor
sums both over the ranks (one all-reduce of two numbers), reports the term per micro-batch (as ``loss`` is) as
``mtp_loss`` in ``loss.jsonl`` and ``mtp <value>`` on the console line, and resets them. A rank records its part
of the term: the masked means are partial sums over the data-parallel and context-parallel ranks (the pass
reduces them after the probe; cp splits the sequence) and complete on every tensor-parallel rank, so the term is
``sum(loss_sum) x dp x cp / sum(forwards)``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from ..distributed.comm.kernels import AllReduceKernel
from ..distributed.process_group import world_group
from ..transformer.mtp import MTPLossProbe


class MTPMonitor:
    """Reads, reduces and resets the MTP probes of ``model`` (a model, or this rank's list of chunks)."""

    def __init__(self, model, data_parallel: int = 1):
        self.dp = data_parallel             # the ranks holding partial sums of one term: dp x cp
        chunks = model if isinstance(model, (list, tuple)) else [model]
        self.probes = [c for chunk in chunks for _, c in chunk.cells_and_names() if isinstance(c, MTPLossProbe)]
        group = world_group()
        self.reduce = AllReduceKernel(group, "sum") if group.size > 1 else None
        self.reset()

    def reset(self) -> None:
        for p in self.probes:
            for param in (p.loss_sum, p.forwards):
                ops.assign(param, ops.zeros(param.shape, ms.float32))

    def __call__(self) -> Tuple[Dict[str, Any], str]:
        vec = np.zeros((2,), np.float32)
        for p in self.probes:
            vec += [float(p.loss_sum.asnumpy()), float(p.forwards.asnumpy())]
        if self.reduce is not None:
            vec = self.reduce(Tensor(vec)).asnumpy()
        self.reset()
        value = float(vec[0] * self.dp / max(vec[1], 1.0))
        return {"mtp_loss": value}, f"mtp {value:.4f}"


def mtp_monitor(model, config) -> Optional[MTPMonitor]:
    """A monitor for a model with MTP depths (``config.mtp_num_layers``), else None."""
    if not getattr(config, "mtp_depths", 0):
        return None
    return MTPMonitor(model, config.data_parallel_size * config.context_parallel_size)


def combined(*reports: Optional[Callable[[], Tuple[Dict[str, Any], str]]]):
    """One ``() -> (fields, text)`` of the step log from several (None ones left out); None when none is given."""
    present = [r for r in reports if r is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def report():
        fields, texts = {}, []
        for r in present:
            f, t = r()
            fields.update(f)
            texts.append(t)
        return fields, "  ".join(texts)
    return report
