"""Write tests/data/torch_pipeline_orders.json: PyTorch 2.13's exec orders (compute plus
send/recv) for its multi-stage pipeline schedules, with and without deferred receives, so that
tests/test_pipeline_pair_order.py checks them against our validator without needing torch.

Run once in a throwaway venv holding torch (a CPU wheel is enough; no process group is made):
    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.13.0+cpu  (or the local wheel)
    /tmp/tv/bin/python scripts/make_torch_pipeline_orders.py

Stages are stand-ins carrying only what the schedules' constructors read (stage index, group
size and rank, number of stages); the orders are torch's own lowering
(``_prepare_schedule_with_comms``: ``_add_send_recv``, then ``_defer_recv_ops`` when
``defer_pp_recv=True``). Each rank's order is one string of actions as torch prints them, space-separated ("0F6",
"1SEND_B0", "2RECV_F3", "(0F1;3B0)OVERLAP_F_B"); UNSHARD/RESHARD/REDUCE_GRAD are dropped.
"""
import json
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S

CLASSES = ["ScheduleLoopedBFS", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
           "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]
SIZES = [(2, 4), (4, 8)]                 # (pipeline ranks, microbatches); 2 stages per rank
DROP = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}


class FakeStage:
    """What the schedule constructors read from a PipelineStage, and no more."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = group_size, group_rank
        self.submod = None
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1


def order_of(cls_name, p, m, defer):
    cls = getattr(S, cls_name)
    style = "v" if cls_name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV") else "loop"
    stage_to_rank = S.generate_stage_to_rank_mapping(p, 2 * p, style=style)
    stages = [FakeStage(s, 2 * p, p, 0) for s in sorted(s for s, r in stage_to_rank.items() if r == 0)]
    sched = cls(stages, m, defer_pp_recv=defer)
    out = {}
    for rank, actions in sched.pipeline_order_with_comms.items():
        out[str(rank)] = " ".join(str(a) for a in actions
                                  if a is not None and a.computation_type.name not in DROP)
    return {"schedule": cls_name, "pp": p, "microbatches": m, "defer_pp_recv": defer,
            "placement": [stage_to_rank[s] for s in range(2 * p)], "order": out}


def main(path="tests/data/torch_pipeline_orders.json"):
    cases = [order_of(c, p, m, d) for c in CLASSES for p, m in SIZES for d in (False, True)]
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, separators=(",", ":"))
    print(f"{path}: {len(cases)} orders, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
