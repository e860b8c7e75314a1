"""Plain MindSpore 2.10, no mindformers_core: what a PyNative gradient through a compiled graph costs against
the same gradient compiled in one graph, per call, on CPU.

A pipeline stage under jit that keeps its forward's record for the backward (the runtime's ``_Tape``)
is a PyNative autograd record around an ``ms.jit`` function, then a backward of that record. One graph
computing loss and gradients (``ms.jit(ms.value_and_grad(...))``) is what a stage whose backward follows
its forward (1F1B's last stage) can run instead. Rows, per call (one microbatch), median of ``--calls``:

* ``forward``: the compiled forward alone (no gradient);
* ``recorded forward + backward``: ``ms.value_and_grad`` in PyNative over the compiled forward (MindSpore
  compiles the forward to also return what its backward graph needs, then runs that backward graph);
* ``one graph``: ``ms.jit(ms.value_and_grad(...))``.

Wall and CPU seconds (user + sys, all threads) per call; ``--pin`` runs the process on one core (what a
rank of a 2-worker job on 2 cores gets while the other computes).

    python bench/grad_over_jit.py [--pin] [--calls 20] [--tokens 256] [--hidden 256] [--ffn 1024] [--layers 2]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pin", action="store_true", help="run on one core")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="MindSpore CPU kernel threads")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "grad_over_jit.json"))
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    ms.set_seed(0)

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.up = nn.Dense(args.hidden, args.ffn, has_bias=False)
            self.down = nn.Dense(args.ffn, args.hidden, has_bias=False)
            self.qkv = nn.Dense(args.hidden, 3 * args.hidden, has_bias=False)
            self.out = nn.Dense(args.hidden, args.hidden, has_bias=False)

        def construct(self, x):
            q, k, v = ops.split(self.qkv(x), args.hidden, axis=-1)
            attn = ops.softmax(ops.matmul(q, k.T) / float(np.sqrt(args.hidden)), axis=-1)
            x = x + self.out(ops.matmul(attn, v))
            return x + self.down(ops.silu(self.up(x)))

    net = nn.SequentialCell([Block() for _ in range(args.layers)])
    params = net.trainable_params()
    x = Tensor(np.random.default_rng(0).standard_normal((args.tokens, args.hidden)).astype(np.float32))

    def loss_fn(x):
        return (net(x) ** 2).mean()

    forward = ms.jit(loss_fn)
    recorded = ms.value_and_grad(forward, None, params)          # PyNative autograd around the compiled forward
    one_graph = ms.jit(ms.value_and_grad(loss_fn, None, params))

    def run_forward():
        forward(x).asnumpy()

    def run_recorded():
        loss, grads = recorded(x)
        grads[-1].asnumpy()

    def run_one_graph():
        loss, grads = one_graph(x)
        grads[-1].asnumpy()

    rows = {}
    for name, fn in (("forward", run_forward), ("recorded forward + backward", run_recorded),
                     ("one graph", run_one_graph)):
        for _ in range(3):
            fn()
        walls, cpus = [], []
        for _ in range(args.calls):
            t, c = time.perf_counter(), sum(os.times()[:2])
            fn()
            walls.append(time.perf_counter() - t)
            cpus.append(sum(os.times()[:2]) - c)
        rows[name] = {"wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus),
                      "wall_ms_min": 1e3 * min(walls), "wall_ms_max": 1e3 * max(walls)}
    print(f"{'row':30s} {'wall ms':>9s} {'[min-max]':>15s} {'cpu ms':>8s}")
    for name, r in rows.items():
        print(f"{name:30s} {r['wall_ms']:9.2f} [{r['wall_ms_min']:.1f}-{r['wall_ms_max']:.1f}] {r['cpu_ms']:8.1f}")
    extra = rows["recorded forward + backward"]["wall_ms"] - rows["one graph"]["wall_ms"]
    print(f"recorded - one graph: {extra:.2f} ms per call "
          f"({rows['recorded forward + backward']['wall_ms'] / rows['one graph']['wall_ms']:.2f}x)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "load": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
