"""Plain MindSpore 2.10, no mindformers_core: on CPU, touching an output of a compiled graph that is ready
early while the graph still runs makes the graph itself 2-3x slower.

``ms.jit`` launches asynchronously; reading an output (``asnumpy``, or an eager op taking it) waits for it.
Two jit ``value_and_grad`` calls of the same MLP, each followed by one ``asnumpy``:

* ``read last``: the first layer's weight gradient, which backpropagation produces last;
* ``read early``: the last layer's weight gradient, produced first, so the read waits while the rest
  of the graph still runs.

Per call (median of ``--calls``): wall and CPU milliseconds (user + sys, all threads), and each thread's
CPU over the calls. Measured on the 2-core machine (docs/performance.md): the early read spins the calling
thread and the graph's own threads take longer, so the call's wall and CPU both grow.

    python bench/early_read.py [--calls 24] [--tokens 256] [--hidden 256] [--ffn 1024] [--layers 4]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np


def thread_ticks():
    """CPU ticks per thread name of this process (/proc/self/task)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="MindSpore CPU kernel threads")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "early_read.json"))
    args = parser.parse_args()
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    ms.set_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Dense(args.hidden, args.ffn), nn.GELU(), nn.Dense(args.ffn, args.hidden)]
    net = nn.SequentialCell(layers)
    params = net.trainable_params()
    x = Tensor(np.random.default_rng(0).standard_normal((args.tokens, args.hidden)).astype(np.float32))

    def loss_fn(x):
        return (net(x) ** 2).mean()

    step = ms.jit(ms.value_and_grad(loss_fn, None, params))
    first_layer, last_layer = 0, len(params) - 2          # weights (each Dense: weight, bias)
    rows = {}
    for name, index in (("read last", first_layer), ("read early", last_layer)) * 2:
        for _ in range(3):
            step(x)[1][index].asnumpy()
        walls, cpus = [], []
        before = thread_ticks()
        for _ in range(args.calls):
            t, c = time.perf_counter(), sum(os.times()[:2])
            _, grads = step(x)
            grads[index].asnumpy()
            walls.append(time.perf_counter() - t)
            cpus.append(sum(os.times()[:2]) - c)
        after = thread_ticks()
        tick = os.sysconf("SC_CLK_TCK")
        rows[name] = {"wall_ms": 1e3 * statistics.median(walls), "wall_ms_min": 1e3 * min(walls),
                      "wall_ms_max": 1e3 * max(walls), "cpu_ms": 1e3 * statistics.median(cpus),
                      "threads_cpu_ms_per_call": {k: round(1e3 * (v - before.get(k, 0)) / tick / args.calls, 1)
                                                  for k, v in after.items() if v - before.get(k, 0) > 0}}
    print(f"{'read':12s} {'wall ms':>8s} {'[min-max]':>14s} {'cpu ms':>7s}  CPU ms per call by thread")
    for name, r in rows.items():
        print(f"{name:12s} {r['wall_ms']:8.1f} [{r['wall_ms_min']:.0f}-{r['wall_ms_max']:.0f}] {r['cpu_ms']:7.1f}  "
              f"{r['threads_cpu_ms_per_call']}")
    print(f"early / last: wall {rows['read early']['wall_ms'] / rows['read last']['wall_ms']:.2f}x, "
          f"cpu {rows['read early']['cpu_ms'] / rows['read last']['cpu_ms']:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "load": os.getloadavg(), "mindspore": ms.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
