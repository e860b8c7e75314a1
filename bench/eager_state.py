"""The slow eager state of a fresh PyNative trainer process, measured from inside.

Builds the trainer of bench/trainer.py's YAML (one process, PyNative), runs ``--slow`` steps of its
own ``step_fn`` in the fresh process, then one tiny ``ms.jit`` graph (``x * 2 + 1`` on 4 floats), then
``--fast`` more steps. Per step: wall time, the process's user/system CPU (``getrusage``), minor page
faults, voluntary/involuntary context switches, and the CPU of each thread (``/proc/self/task``, by
thread name). With ``--strace`` it attaches ``strace -f -c`` to itself over ``--window`` steps of each
phase (after the first step of the phase) and prints both syscall summaries.

    python bench/eager_state.py [--slow 5] [--fast 5] [--strace] [--window 3] [--prime between|none|before|every]
"""
import argparse
import os
import resource
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
TICK = os.sysconf("SC_CLK_TCK")


def threads():
    """{thread name: (utime s, stime s)} summed over threads of the same name."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        u, s = int(fields[11]) / TICK, int(fields[12]) / TICK
        a = out.get(name, (0.0, 0.0))
        out[name] = (a[0] + u, a[1] + s)
    return out


def snapshot():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return dict(t=time.monotonic(), user=r.ru_utime, sys=r.ru_stime, minflt=r.ru_minflt, vcsw=r.ru_nvcsw,
                ivcsw=r.ru_nivcsw, threads=threads())


def delta(a, b):
    d = {k: b[k] - a[k] for k in ("t", "user", "sys", "minflt", "vcsw", "ivcsw")}
    per = {}
    for name, (u, s) in b["threads"].items():
        u0, s0 = a["threads"].get(name, (0.0, 0.0))
        if (u - u0) + (s - s0) >= 0.02:
            per[name] = (round(u - u0, 2), round(s - s0, 2))
    d["threads"] = per
    return d


class Strace:
    def __init__(self, path):
        self.path = path
        self.proc = subprocess.Popen(["strace", "-f", "-c", "-o", path, "-p", str(os.getpid())],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)        # attached to every thread

    def finish(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        with open(self.path) as f:
            return f.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=5)
    parser.add_argument("--fast", type=int, default=5)
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--prime", default="between", choices=["between", "none", "before", "every"],
                        help="when the tiny jit graph runs: between the phases (default), never, once before the "
                             "first step, after every step")
    parser.add_argument("--assets", default=os.path.join(ROOT, "bench", "results", "trainer_assets"))
    parser.add_argument("--out", default="/tmp/eager_state_out")
    a = parser.parse_args()
    import mindspore as ms
    from mindspore import Tensor
    from trainer import assets
    from mindformers_core.training.config import read_yaml, validate
    from mindformers_core.common.batch import model_args
    from mindformers_core.training.trainer import Trainer
    paths = assets(a.assets)
    config = validate(read_yaml(paths["yaml"]), [f"output_dir={a.out}", "context.mode=1",
                                                 "overwrite_output_dir=True"], worker_num=1, source=paths["yaml"])
    trainer = Trainer(config, worker_num=1)
    trainer.setup()
    batches = trainer.inputs.batches()

    f = ms.jit(lambda_free)
    x4 = Tensor([1.0, 2.0, 3.0, 4.0], ms.float32)

    def prime():
        t0 = time.monotonic()
        f(x4).asnumpy()
        return time.monotonic() - t0

    if a.prime == "before":
        print(f"--- tiny jit graph before the first step: {prime():.2f} s", flush=True)

    def phase(name, n):
        print(f"--- {name}", flush=True)
        tracer = None
        for i in range(n):
            if a.strace and i == 1:
                tracer = Strace(f"/tmp/eager_state_strace_{name}.txt")
            args = model_args(next(batches), Tensor)
            s0 = snapshot()
            loss, norm = (float(x) for x in trainer.step_fn(*args))
            extra = f" (+ tiny graph {prime() * 1000:.1f} ms)" if a.prime == "every" else ""
            d = delta(s0, snapshot())
            top = sorted(d["threads"].items(), key=lambda kv: -sum(kv[1]))[:6]
            print(f"{name} step {i + 1}: {d['t']:.2f} s wall, user {d['user']:.2f} sys {d['sys']:.2f}, "
                  f"minflt {d['minflt']}, vcsw {d['vcsw']} ivcsw {d['ivcsw']}, loss {loss:.4f}{extra}; threads "
                  + " ".join(f"{k}={u}/{s}" for k, (u, s) in top), flush=True)
            if tracer is not None and i == a.window:
                print(tracer.finish(), flush=True)
                tracer = None
        if tracer is not None:
            print(tracer.finish(), flush=True)

    phase("first", a.slow)
    if a.prime == "between":
        print(f"--- tiny jit graph: {prime():.2f} s", flush=True)
    phase("second", a.fast)


def lambda_free(x):
    return x * 2 + 1


if __name__ == "__main__":
    main()
