"""Sharding propagation: planning time vs model depth, and redistribution bytes per step vs the
hand-written Megatron placement of the same model.

The model is a stack of pre-norm transformer blocks declared only through ``shard()`` (the test
models in tests/sharding_models.py: column q/k/v, row projection, column/row MLP). Planning =
trace one forward + propagate; both are timed separately. Megatron's placement of the same block
communicates, per layer and step, 2 all-reduces of B*S*H forward (after the attention projection
and after the MLP) and 2 backward (before the fused QKV and before fc1); with sequence parallel
the all-reduces become all-gather + reduce-scatter pairs. Both sides use the same ring cost model
(bytes sent per rank). Prints a table and writes bench/results/propagation.json.

    python bench/propagation.py [--layers 8 32 128] [--tp 2] [--dp 1]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindspore import nn  # noqa: E402

from mindformers_core.sharding import Layout, plan_redistribution  # noqa: E402
from mindformers_core.sharding.parallelizer import default_input_layouts, mesh_layout  # noqa: E402
from mindformers_core.sharding.propagation import collect_declarations, propagate  # noqa: E402
from mindformers_core.sharding.trace import trace  # noqa: E402
from tests.sharding_models import Block  # noqa: E402

B, S, H, HEADS = 4, 8, 16, 4


class Stack(nn.Cell):
    def __init__(self, layers, sequence_parallel):
        super().__init__()
        self.layers = nn.CellList([Block(H, HEADS, S, sequence_parallel) for _ in range(layers)])

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def megatron_bytes(layers, mesh: Layout, sequence_parallel):
    shape = (B, S, H)
    rep = mesh("dp", "None", "None")
    partial = rep.with_partial(["tp"], "sum")
    if sequence_parallel:
        seq = mesh("dp", "tp", "None")
        per = (plan_redistribution(seq, rep, shape).bytes_per_rank
               + plan_redistribution(partial, seq, shape).bytes_per_rank)
    else:
        per = plan_redistribution(partial, rep, shape).bytes_per_rank
    return layers * 2 * 2 * per     # 2 sites per layer, forward and backward


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    args = ap.parse_args()
    config = {"dp": args.dp, "tp": args.tp}
    mesh = mesh_layout(config)
    rows = []
    for sp in (False, True):
        for n in args.layers:
            model = Stack(n, sp)
            t0 = time.perf_counter()
            graph = trace(model, ((B * args.dp, S, H), "float32"))
            t1 = time.perf_counter()
            plan = propagate(graph, mesh, collect_declarations(graph, config),
                             default_input_layouts(graph, mesh))
            t2 = time.perf_counter()
            # boundary traffic only: the model input's own slicing is not part of Megatron's count
            ours = sum(r.bytes_per_rank for r in plan.redistributions if r.where != "enter of <model> tensor 0")
            ref = megatron_bytes(n, mesh, sp)
            rows.append({"layers": n, "sequence_parallel": sp, "nodes": len(graph.nodes),
                         "trace_s": t1 - t0, "propagate_s": t2 - t1,
                         "propagate_ms_per_layer": 1000 * (t2 - t1) / n,
                         "redistributions": len(plan.redistributions), "bytes_per_step": ours,
                         "megatron_bytes_per_step": ref, "bytes_ratio": ours / ref})
    head = (f"{'layers':>6} {'SP':>3} {'nodes':>6} {'trace s':>8} {'prop s':>7} {'ms/layer':>8} "
            f"{'redists':>7} {'ours B':>9} {'Megatron B':>10} {'ratio':>6}")
    print(f"propagation on mesh dp={args.dp} tp={args.tp}, block B={B} S={S} H={H}")
    print(head)
    for r in rows:
        print(f"{r['layers']:>6} {'y' if r['sequence_parallel'] else 'n':>3} {r['nodes']:>6} {r['trace_s']:>8.2f} "
              f"{r['propagate_s']:>7.2f} {r['propagate_ms_per_layer']:>8.1f} {r['redistributions']:>7} "
              f"{r['bytes_per_step']:>9} {r['megatron_bytes_per_step']:>10} {r['bytes_ratio']:>6.2f}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "propagation.json"), "w") as f:
        json.dump({"dp": args.dp, "tp": args.tp, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
