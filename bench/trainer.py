"""The real trainer (``run_mindformer.py`` through ``scripts/msrun_launcher.sh``) on 1, 2 and 4 CPU
workers, in jit and PyNative, against one process of the same config and a plain-MindSpore model.

Sizes (issue 20's reference): Llama decoder, hidden 256, 4 layers, 4 heads, FFN 1024, seq 128,
vocab 1024, global batch 8, AdamW, fp32. Configurations:

* ``1proc``: one process (the launcher runs plain python);
* ``dp2`` / ``tp2``: 2 workers;  ``pp2``: 2 stages, 1F1B, 4 microbatches of 2 rows;  ``pp2_zbv``: ZBV
  (2 stages per rank, 4 microbatches);  ``dp2tp2``: 4 workers (``batch_size`` is rows per microbatch
  and data-parallel rank, as in MindFormers, so every row trains on the same 8 rows per step);
* ``plain``: the same Llama written here in plain MindSpore (``nn.Dense``, ``nn.AdamWeightDecay``, no
  mindformers_core) on one process: the overhead ratio of ``1proc`` against it;  ``plain_clip``: the
  same with ``ops.clip_by_global_norm(grads, 1.0)`` before the update, the clipping the trainer does
  by default (``runner_config.max_grad_norm: 1.0``), so that both sides do the same job;
  ``1proc_noclip``: one process without clipping, bad-step guard or gradient norm
  (``max_grad_norm: 0``, ``use_skip_step_on_nan: False``, ``log_grad_norm: False``): ``plain``'s job
  (its losses differ from ``1proc``'s, which clips: no parity column);
* ``1proc_async``, ``dp2_async``, ``tp2_async``, ``pp2_async``: those rows with ``MFC_JIT_BLOCKING=0``,
  MindSpore's asynchronous graph launch (``mindformers_core/common/graphs.py``; the same in PyNative
  except for the pipeline's and hsdp's compiled parts);
* ``dp2_mccl``: dp2 with ``MFC_HOST_SUM=0``: the gradients summed by MindSpore's CPU all-reduce inside the
  one-graph step instead of through shared memory between the gradient and update graphs
  (``mindformers_core/distributed/comm/host_sum.py``);  ``dp2_zero1``: dp2 with the optimizer split over
  the ranks (``parallel.enable_parallel_optimizer``, hsdp level1);
* ``pp2_unfused``: pp2 with ``MFC_PIPELINE_FUSE_LAST=0``: the last stage's forward and backward of a
  microbatch as a taped forward and its backward instead of one compiled call.

Per row: the largest relative difference of its losses to ``1proc``'s (same data: parity), the
median step time of the steps after ``--warmup`` (``step_time_s`` of rank 0's loss.jsonl:
data wait + compute), the ratio to ``1proc`` of the same mode, tokens/s, the peak RSS of each rank
(VmHWM sampled from /proc while the job runs) and the per-step times. For pipeline rows the
runtime records every step (``MFC_PIPELINE_TRACE``: a host sync after each compute step and
transfer) and a breakdown per pipeline step is printed: forward and backward compute, transfer
(both ranks there), waiting for the peer, Python between steps inside the schedule run, and
outside it (optimizer update, loss sharing, data, logging). ``--no-trace`` leaves the runtime
unrecorded. Writes bench/results/trainer.json (or ``--out``).

    python bench/trainer.py [--configs 1proc dp2 tp2 pp2 pp2_zbv dp2tp2 plain plain_clip] [--modes jit pynative]
                            [--steps 10] [--warmup 2] [--threads N] [--no-trace] [--repeats 3]
                            [--peer torch --peer-python /path/to/torch-venv/bin/python]

``--peer mindformers`` runs MindFormers 2.1.0's own legacy Llama (its ``LlamaForCausalLM`` blocks, its
``ClipGradNorm`` and ``AdamW``, one ``ms.jit`` step; bench/mindformers_peer.py, under ``--peer-python`` or
$MFC_MINDFORMERS_PYTHON: the venv of scripts/make_mindformers_fixtures.py) right after our ``1proc`` row of the
first mode, as a row of mode ``mindformers`` in the same table (random ids: no parity column).

``--peer torch`` runs PyTorch's equivalents of the ``1proc``, ``dp2``, ``tp2`` and ``pp2`` rows
(bench/torch_peer.py: one process, DDP, DTensor tensor parallel, ``torch.distributed.pipelining``
1F1B with 4 microbatches; the same Llama, sizes, AdamW and clipping) right after ours in every
repeat, as rows of mode ``torch``, and prints our ratio to one process next to PyTorch's. torch is a
bench-only extra: it runs under ``--peer-python`` (an interpreter where ``import torch`` works, never
the project's venv; default $MFC_TORCH_PYTHON, else ``python``/``python3`` on PATH), and the bench
stops before anything runs, naming what to install, when there is none.

Every trainer and torch row also gets the CPU seconds (user + sys, all threads) of each process per
timed step and its CPU/wall (ours sampled from /proc every 0.1 s against the steps in loss.jsonl;
torch's from ``getrusage`` around its timed steps): a rank that spins while it waits shows CPU/wall
near 1 (or above, with several threads) where one that sleeps shows less. On a loaded machine
these ratios move less than the step times.

The machine these figures come from has 2 cores: run subsets (``--configs pp2 --modes jit --steps 8``).
``--threads N`` sets each worker's CPU kernel threads through the trainer's ``MFC_CPU_THREADS``
(default: the trainer's own default, cores // workers on the host; ``--threads 25`` is MindSpore's
default, which the trainer used before it had the setting); the plain row sets the same number
itself. ``--runtime-threads N`` sets runtime_num_threads through a small wrapper written next to the
assets (the trainer has no setting for it). ``--repeats R`` runs every row R times (in turn, so
that a slow phase of the shared machine spreads over the rows) and reports the median and min-max
of the R medians.
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HIDDEN, LAYERS, HEADS, FFN, SEQ, VOCAB, GLOBAL_BATCH = 256, 4, 4, 1024, 128, 1024, 8
PAR = ["--use_parallel", "True"]
PP2 = PAR + ["--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4]
# one process doing plain MindSpore's job: no clipping, no bad-step guard, no gradient norm computed
NOCLIP = ["--runner_config.max_grad_norm", 0, "--runner_config.use_skip_step_on_nan", "False",
          "--runner_config.log_grad_norm", "False"]
OVERHEAD = (("1proc", "plain"), ("1proc", "plain_clip"), ("1proc_noclip", "plain"))   # the same job each
CONFIGS = {   # name -> (workers, flags)
    "1proc": (1, []),
    "1proc_noclip": (1, NOCLIP),
    "dp2": (2, PAR + ["--parallel_config.data_parallel", 2]),
    "tp2": (2, PAR + ["--parallel_config.model_parallel", 2]),
    "pp2": (2, PP2),
    "pp2_zbv": (2, PP2 + ["--parallel.pipeline_config.pipeline_interleave", 2,
                          "--parallel.pipeline_config.pipeline_scheduler", "zbv"]),
    "dp2tp2": (4, PAR + ["--parallel_config.data_parallel", 2, "--parallel_config.model_parallel", 2]),
    "plain": (1, None),
    "plain_clip": (1, None),
}
# the same rows with MindSpore's asynchronous graph launch (MFC_JIT_BLOCKING=0, common/graphs.py): jit only
ASYNC = "_async"
for _name in ("1proc", "dp2", "tp2", "pp2"):
    CONFIGS[_name + ASYNC] = CONFIGS[_name]
# dp2 with MindSpore's CPU all-reduce inside the one-graph step (MFC_HOST_SUM=0), not the shared-memory sum
# between the gradient and update graphs (distributed/comm/host_sum.py): the before/after of that change
MCCL = "_mccl"
CONFIGS["dp2" + MCCL] = CONFIGS["dp2"]
# pp2 with the last stage's forward and backward as two calls per microbatch (a taped forward, then its
# backward), not one compiled call (MFC_PIPELINE_FUSE_LAST=0, pipeline/runtime.py): the before/after of that change
UNFUSED = "_unfused"
CONFIGS["pp2" + UNFUSED] = CONFIGS["pp2"]
# pp2 with the first stage's forward compiled without the PyNative tape, its backward one compiled call that runs
# the forward again (MFC_PIPELINE_RECOMPUTE=1; the last stage stays fused): tape against recompute
RECOMPUTED = "_recompute"
CONFIGS["pp2" + RECOMPUTED] = CONFIGS["pp2"]
VARIANT_ENV = {ASYNC: ("MFC_JIT_BLOCKING", "0"), MCCL: ("MFC_HOST_SUM", "0"),   # a variant row's suffix -> the
               UNFUSED: ("MFC_PIPELINE_FUSE_LAST", "0"),                        # switch it sets for its workers
               RECOMPUTED: ("MFC_PIPELINE_RECOMPUTE", "1")}
# dp2 with the optimizer split over the two ranks (hsdp level1, ZeRO-1: gradients reduce-scattered, each rank
# updates its half, parameters all-gathered), through MindSpore's collectives
CONFIGS["dp2_zero1"] = (2, CONFIGS["dp2"][1] + ["--parallel.enable_parallel_optimizer", "True",
                                                 "--hsdp.optimizer_level", "level1"])
PLAIN = ("plain", "plain_clip")   # the plain-MindSpore rows (no mindformers_core): without / with clipping
DP = {"dp2": 2, "dp2tp2": 2, "dp2_zero1": 2}
MICRO = {"pp2": 4, "pp2_zbv": 4}   # runner_config.batch_size is rows per microbatch (MindFormers)


def rows_per_microbatch(name: str) -> int:
    """batch_size for a global batch of GLOBAL_BATCH rows: global = batch_size x dp x micro_batch_num."""
    for suffix in VARIANT_ENV:
        name = name[:-len(suffix)] if name.endswith(suffix) else name
    return GLOBAL_BATCH // (DP.get(name, 1) * MICRO.get(name, 1))


# ---- assets -----------------------------------------------------------------------------------------
def assets(root: str) -> dict:
    """Corpus, tokenizer and the YAML of the reference sizes under ``root`` (built once)."""
    import yaml
    from mindformers_core.data.corpus import build_corpus
    from mindformers_core.data.tokenizer import train_tokenizer
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    corpus = os.path.join(root, "data", "corpus.txt")
    tok = os.path.join(root, "tok.model")
    if not os.path.exists(tok):
        build_corpus(corpus, max_bytes=400_000)
        tok = train_tokenizer([corpus], os.path.join(root, "tok"), VOCAB)
    with open(os.path.join(ROOT, "configs", "llama_tiny.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["model"]["model_config"].update(num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN,
                                        num_heads=HEADS, n_kv_heads=HEADS, seq_length=SEQ, vocab_size=VOCAB)
    raw["train_dataset"].update(dataset_dir=corpus, tokenizer_file=tok)
    raw["runner_config"].update(batch_size=GLOBAL_BATCH, epochs=100)
    raw["lr_schedule"].update(warmup_steps=0)
    raw["callbacks"] = [{"type": "MFLossMonitor", "per_print_times": 1}]
    path = os.path.join(root, "bench_trainer.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return {"yaml": path, "corpus": corpus, "tokenizer": tok, "capped": capped_script(root)}


# ---- peak RSS of a process tree -----------------------------------------------------------------------
class RssWatch:
    """Samples VmHWM (peak resident set) of every process under ``pid`` whose command line runs
    ``marker``, every ``period`` seconds; keyed by the rank in its environment (RANK_ID), else pid.
    With ``progress`` (a loss.jsonl being written) it also samples each rank's CPU seconds (user +
    sys of all its threads, /proc/<pid>/stat) against the steps logged so far: ``cpu_window``."""

    def __init__(self, pid: int, marker: str, period: float = 0.5, progress: str = None):
        self.pid, self.marker, self.period, self.progress = pid, marker, period, progress
        self.peak = {}
        self.samples = []       # (monotonic time, steps logged, {rank: cpu seconds})
        self.tick = os.sysconf("SC_CLK_TCK")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _children(self):
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            try:
                with open(f"/proc/{p}/task/{p}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
        return out

    def _steps_logged(self):
        try:
            with open(self.progress) as f:
                return sum(1 for line in f if line.strip())
        except OSError:
            return 0

    def _loop(self):
        while not self.stop.is_set():
            cpu = {}
            logged = self._steps_logged() if self.progress else None
            now = time.monotonic()
            for p in [self.pid] + self._children():
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    if self.marker not in cmd:
                        continue
                    with open(f"/proc/{p}/environ", "rb") as f:
                        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                    if env.get(b"MS_ROLE") == b"MS_SCHED":
                        continue
                    rank = ("rank" + env[b"RANK_ID"].decode()) if b"RANK_ID" in env else f"pid{p}"
                    with open(f"/proc/{p}/status") as f:
                        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
                    self.peak[rank] = max(self.peak.get(rank, 0), hwm * 1024)
                    if self.progress:
                        with open(f"/proc/{p}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                        cpu[rank] = (int(fields[11]) + int(fields[12])) / self.tick   # utime + stime
                except (OSError, StopIteration, ValueError):
                    continue
            if self.progress and cpu:
                self.samples.append((now, logged, cpu))
            self.stop.wait(self.period)

    def cpu_window(self, first: int):
        """CPU seconds per step of each rank and its CPU/wall, between the first sample with
        ``first`` steps logged and the last sample with more (the timed steps; the window edges
        are as fine as the sampling period). None without samples."""
        start = next((x for x in self.samples if x[1] >= first), None)
        # the first sample showing the most steps logged while every process of the start is alive
        # (later samples hold the job's teardown; a rank may exit before rank 0 logs the last step)
        alive = [x for x in self.samples if start and x[0] >= start[0] and set(start[2]) <= set(x[2])]
        most = max((x[1] for x in alive), default=None)
        end = next((x for x in alive if x[1] == most and most > start[1]), None)
        if start is None or end is None:
            return None
        wall, steps = end[0] - start[0], end[1] - start[1]
        both = [r for r in end[2] if r in start[2]]
        ranks = [r for r in both if r.startswith("rank")]
        if ranks:
            cpu = {r[4:]: end[2][r] - start[2][r] for r in ranks}
        else:           # one process: the launcher's shell also matches; the trainer is the busiest
            busiest = max(both, key=lambda r: end[2][r] - start[2][r], default=None)
            cpu = {"0": end[2][busiest] - start[2][busiest]} if busiest else {}
        return {"steps": steps, "wall_s": wall, "cpu_s_per_step": {r: c / steps for r, c in cpu.items()},
                "cpu_per_wall": {r: c / wall for r, c in cpu.items()}}

    def finish(self):
        self.stop.set()
        self.thread.join()
        ranks = {k: v for k, v in self.peak.items() if k.startswith("rank")}
        # msrun workers carry RANK_ID; otherwise (one process) the largest process is the trainer
        found = ranks or ({"rank0": max(self.peak.values())} if self.peak else {})
        return {k[4:]: found[k] for k in sorted(found, key=lambda r: (len(r), r))}


# ---- one trainer job --------------------------------------------------------------------------------
def free_port() -> int:
    from mindformers_core.testing import free_port as fp
    return fp()


CAPPED = """# written by bench/trainer.py: run_mindformer.py with MindSpore's runtime_num_threads set
import os, runpy, sys
import mindspore as ms
if os.environ.get("MFC_RUNTIME_THREADS"):
    ms.set_context(runtime_num_threads=int(os.environ["MFC_RUNTIME_THREADS"]))
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def capped_script(root: str) -> str:
    """A script running run_mindformer.py with runtime_num_threads from the environment (the
    trainer has no setting for it; its CPU kernel threads are MFC_CPU_THREADS)."""
    path = os.path.join(root, "run_mindformer_capped.py")
    with open(path, "w") as f:
        f.write(CAPPED.format(script=os.path.join(ROOT, "run_mindformer.py")))
    return path


def run_job(name, mode, workers, flags, paths, steps, threads, trace, timeout=900, runtime_threads=0,
            sync_transfers=False, recompute=False, warmup=2):
    out_dir = tempfile.mkdtemp(prefix=f"bench_trainer_{name}_{mode}_")
    script = "run_mindformer.py" if not runtime_threads else paths["capped"]
    argv = [script, "--config", paths["yaml"], "--output_dir", out_dir, "--mode",
            0 if mode == "jit" else 1, "--runner_config.max_steps", steps,
            "--runner_config.batch_size", rows_per_microbatch(name), *flags]
    env = dict(os.environ)
    env.pop("MFC_PIPELINE_TRACE", None)
    env.pop("MFC_CPU_THREADS", None)
    if sync_transfers:
        env["MFC_PIPELINE_SYNC_TRANSFERS"] = "1"
    for suffix, (variable, value) in VARIANT_ENV.items():
        env.pop(variable, None)
        if name.endswith(suffix):
            env[variable] = value
    if recompute:
        env["MFC_PIPELINE_RECOMPUTE"] = "1"
    prefix = os.path.join(out_dir, "pipeline_trace")
    if trace:
        env["MFC_PIPELINE_TRACE"] = prefix
    if threads:
        env["MFC_CPU_THREADS"] = str(threads)
    if runtime_threads:
        env["MFC_RUNTIME_THREADS"] = str(runtime_threads)
    command = " ".join(shlex.quote(str(a)) for a in argv)
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), command, str(workers),
                             str(free_port()), os.path.join(out_dir, "msrun_log"), "True", str(timeout)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    watch = RssWatch(proc.pid, "run_mindformer", period=0.1, progress=os.path.join(out_dir, "loss.jsonl"))
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\nkilled after {timeout} s"
    rss = watch.finish()
    cpu = watch.cpu_window(warmup)
    loss_log = os.path.join(out_dir, "loss.jsonl")
    records = []
    if os.path.exists(loss_log):
        with open(loss_log) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if proc.returncode != 0 and len(records) < steps:
        raise RuntimeError(f"{name} {mode}: exit {proc.returncode}\n{output[-4000:]}")
    if proc.returncode != 0:     # every step logged, then a worker died on the way out (MindSpore's teardown)
        print(f"# {name} {mode}: all {steps} steps logged, then exit {proc.returncode} (kept)", flush=True)
    traces = {}
    for r in range(workers):
        path = f"{prefix}.rank{r}.jsonl"
        if os.path.exists(path):
            with open(path) as f:
                traces[r] = [json.loads(line) for line in f if line.strip()]
    return {"step_times": [r["step_time_s"] for r in records], "losses": [r["loss"] for r in records],
            "rss": rss, "traces": traces, "output_dir": out_dir, "cpu": cpu}


# ---- plain MindSpore: the same Llama without mindformers_core ---------------------------------------------
def plain_model():
    """The plain-MindSpore Llama of the ``plain`` row and its ``nn.AdamWeightDecay``: (net, optimizer).
    ``net(ids, labels)`` -> mean loss. Also used by bench/eager_breakdown.py."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops, Tensor, Parameter
    head_dim = HIDDEN // HEADS

    class RMSNorm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = Parameter(Tensor(np.ones((HIDDEN,), np.float32)), name="weight")

        def construct(self, x):
            return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-5) * self.weight

    def rope_tables():
        inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        freqs = np.outer(np.arange(SEQ, dtype=np.float32), inv)
        emb = np.concatenate([freqs, freqs], -1)
        return Tensor(np.cos(emb)), Tensor(np.sin(emb))

    class Layer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.q, self.k, self.v, self.o = (nn.Dense(HIDDEN, HIDDEN, has_bias=False) for _ in range(4))
            self.gate, self.up = nn.Dense(HIDDEN, FFN, has_bias=False), nn.Dense(HIDDEN, FFN, has_bias=False)
            self.down = nn.Dense(FFN, HIDDEN, has_bias=False)
            self.cos, self.sin = rope_tables()
            self.mask = Tensor(np.triu(np.full((SEQ, SEQ), -1e9, np.float32), 1))
            self.scale = 1.0 / float(np.sqrt(head_dim))

        def rotate(self, x):
            half = head_dim // 2
            rotated = ops.concat((-x[..., half:], x[..., :half]), -1)
            return x * self.cos + rotated * self.sin

        def construct(self, x):
            b, s, _ = x.shape
            h = self.norm1(x)
            q = self.q(h).reshape(b, s, HEADS, head_dim).transpose(0, 2, 1, 3)
            k = self.k(h).reshape(b, s, HEADS, head_dim).transpose(0, 2, 1, 3)
            v = self.v(h).reshape(b, s, HEADS, head_dim).transpose(0, 2, 1, 3)
            q, k = self.rotate(q), self.rotate(k)
            scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + self.mask
            att = ops.matmul(ops.softmax(scores, -1), v).transpose(0, 2, 1, 3).reshape(b, s, HIDDEN)
            x = x + self.o(att)
            h = self.norm2(x)
            return x + self.down(ops.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.CellList([Layer() for _ in range(LAYERS)])
            self.norm = RMSNorm()
            self.head = nn.Dense(HIDDEN, VOCAB, has_bias=False)
            self.loss = nn.CrossEntropyLoss()

        def construct(self, ids, labels):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            logits = self.head(self.norm(x))
            return self.loss(logits.reshape(-1, VOCAB), labels.reshape(-1))

    net = Llama()
    opt = nn.AdamWeightDecay(net.trainable_params(), 1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)
    return net, opt


def plain_worker(mode: str, steps: int, threads: int, clip: bool = False) -> None:
    """Runs in a child process: prints one JSON line with the step times. ``clip``: the gradients
    pass through ``ops.clip_by_global_norm(grads, 1.0)`` first, the clipping the trainer's default
    ``runner_config.max_grad_norm: 1.0`` does, so that the ``plain_clip`` row is the same job."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    # the trainer's eager dispatch setting (MFC_PYNATIVE_SYNC, default synchronous on CPU), so that the
    # overhead ratio compares code, not settings; MFC_PYNATIVE_SYNC=0 gives both MindSpore's queue
    ms.set_context(pynative_synchronize=os.environ.get("MFC_PYNATIVE_SYNC", "1") != "0")
    ms.set_seed(0)
    net, opt = plain_model()
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(ids, labels):
        loss, grads = grad_fn(ids, labels)
        if clip:
            grads = ms.ops.clip_by_global_norm(grads, 1.0)
        opt(grads)
        return loss
    step = ms.jit(step) if mode == "jit" else step
    rng = np.random.default_rng(0)
    times = []
    for _ in range(steps):
        ids = Tensor(rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype(np.int32))
        labels = Tensor(rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype(np.int32))
        t0 = time.perf_counter()
        float(step(ids, labels).asnumpy())
        times.append(time.perf_counter() - t0)
    n_params = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    print("PLAIN_RESULT " + json.dumps({"step_times": times, "params": n_params}), flush=True)


def run_plain(mode, steps, threads, timeout=900, clip=False):
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--plain-worker", mode, "--steps", str(steps),
                             "--threads", str(threads or 0)] + (["--plain-clip"] if clip else []), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    watch = RssWatch(proc.pid, "--plain-worker")
    output, _ = proc.communicate(timeout=timeout)
    rss = watch.finish()
    line = next((ln for ln in output.splitlines() if ln.startswith("PLAIN_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"plain {mode}: exit {proc.returncode}\n{output[-4000:]}")
    result = json.loads(line[len("PLAIN_RESULT "):])
    return {"step_times": result["step_times"], "params": result["params"], "rss": rss, "traces": {}}


# ---- the PyTorch peer (bench/torch_peer.py under another interpreter) --------------------------------
PEER = "torch"              # the mode of the peer's rows (config names are ours: 1proc, dp2, tp2, pp2)
PEER_ROWS = ("1proc", "dp2", "tp2", "pp2")
MF_PEER = "mindformers"     # MindFormers 2.1.0's legacy Llama blocks under ms.jit (bench/mindformers_peer.py): 1proc
PEERS = {PEER: PEER_ROWS, MF_PEER: ("1proc",)}
MF_HINT = ("the venv of scripts/make_mindformers_fixtures.py (mindformers 2.1.0 + mindspore 2.10.0), then "
           "--peer-python /work/mfvenv/bin/python or MFC_MINDFORMERS_PYTHON; mindformers never goes into the "
           "project's own venv")


def mindformers_python(given=None):
    """The interpreter for the MindFormers peer: ``given`` (--peer-python) or $MFC_MINDFORMERS_PYTHON, checked
    with ``import mindformers``; SystemExit naming what to install when there is none."""
    py = given or os.environ.get("MFC_MINDFORMERS_PYTHON")
    if py:
        ok = subprocess.run([py, "-c", "import mindformers"], capture_output=True, text=True,
                            env=dict(os.environ, LOCAL_DEFAULT_PATH=tempfile.gettempdir()))
        if ok.returncode == 0:
            return py
    raise SystemExit(f"bench/trainer.py --peer mindformers: no interpreter where 'import mindformers' works (tried "
                     f"{py!r}); make {MF_HINT}")


def run_mindformers(python, steps, warmup, timeout=900):
    """The MindFormers row: bench/mindformers_peer.py (same sizes as ours, one process, graph mode)."""
    argv = [python, os.path.join(ROOT, "bench", "mindformers_peer.py"), "--steps", str(steps), "--warmup",
            str(warmup), "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--heads", str(HEADS), "--ffn", str(FFN),
            "--seq", str(SEQ), "--vocab", str(VOCAB), "--batch", str(GLOBAL_BATCH)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="mf_peer_"))
    proc = subprocess.run(argv, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MF_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"mindformers peer: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}")
    out = json.loads(line[len("MF_RESULT "):])
    cpu = {"steps": steps - warmup, "wall_s": max(out["wall_s"].values()),
           "cpu_s_per_step": {r: c / (steps - warmup) for r, c in out["cpu_s"].items()},
           "cpu_per_wall": {r: out["cpu_s"][r] / out["wall_s"][r] for r in out["cpu_s"]}}
    # its losses are of random ids, not the trainer rows' corpus: its own reference only (no parity with ours)
    return {"step_times": out["step_times"], "losses": out["losses"], "rss": out["rss"], "traces": {}, "cpu": cpu,
            "torch": f"mindformers {out['mindformers']}", "threads": out["threads"]}
TORCH_HINT = ("python -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy "
              "--index-url https://download.pytorch.org/whl/cpu (a local wheel works too), then "
              "--peer-python /tmp/torchvenv/bin/python; torch never goes into the project's own venv")


def torch_python(given=None):
    """The interpreter for the torch peer: ``given`` (--peer-python), else the first of
    $MFC_TORCH_PYTHON, ``python``, ``python3`` on PATH in which ``import torch`` works. Raises
    SystemExit naming what to install when there is none."""
    import shutil
    candidates = [given] if given else [os.environ.get("MFC_TORCH_PYTHON"), shutil.which("python"),
                                        shutil.which("python3")]
    tried = []
    for py in candidates:
        if not py:
            continue
        ok = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True) if os.path.exists(py) \
            or shutil.which(py) else None
        if ok is not None and ok.returncode == 0:
            return py
        tried.append(f"{py} ({'no such file' if ok is None else (ok.stderr.strip().splitlines() or ['?'])[-1]})")
    raise SystemExit("bench/trainer.py --peer torch: no interpreter where 'import torch' works; tried "
                     + "; ".join(tried or ["nothing"]) + ". Install it in a separate venv: " + TORCH_HINT)


def run_torch(python, name, steps, warmup, threads, timeout=900):
    """One row of the peer: bench/torch_peer.py ``--config name`` (same sizes as ours)."""
    argv = [python, os.path.join(ROOT, "bench", "torch_peer.py"), "--config", name, "--steps", str(steps),
            "--warmup", str(warmup), "--threads", str(threads or 0), "--hidden", str(HIDDEN), "--layers",
            str(LAYERS), "--heads", str(HEADS), "--ffn", str(FFN), "--seq", str(SEQ), "--vocab", str(VOCAB),
            "--batch", str(GLOBAL_BATCH)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TORCH_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"torch {name}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}")
    out = json.loads(line[len("TORCH_RESULT "):])
    cpu = {"steps": steps - warmup, "wall_s": max(out["wall_s"].values()),
           "cpu_s_per_step": {r: c / (steps - warmup) for r, c in out["cpu_s"].items()},
           "cpu_per_wall": {r: out["cpu_s"][r] / out["wall_s"][r] for r in out["cpu_s"]}}
    return {"step_times": out["step_times"], "losses": out["losses"], "rss": out["rss"], "traces": {},
            "cpu": cpu, "torch": out["torch"], "threads": out["threads"]}


# ---- pipeline breakdown -----------------------------------------------------------------------------
COMPUTE = {"FWD": "forward", "BWD": "backward", "BWD_INPUT": "backward", "BWD_WEIGHT": "backward"}


def breakdown(traces, step_times, warmup):
    """Per rank, median over the timed steps of: forward, backward, transfer, wait, python (inside
    the schedule run, between steps), outside (step time - run span) in seconds."""
    runs = {r: rows[warmup:] for r, rows in traces.items()}
    n = min(len(v) for v in runs.values()) if runs else 0
    per_rank = {}
    for r, rows in runs.items():
        parts = {k: [] for k in ("forward", "backward", "transfer", "wait", "python", "outside", "run")}
        for i in range(n):
            row = rows[i]
            sums = dict.fromkeys(parts, 0.0)
            for kind, mb, stage, a, b in row["steps"]:
                if kind in COMPUTE:
                    sums[COMPUTE[kind]] += b - a
                elif kind.endswith(("SEND", "RECV")):
                    peer = _peer_start(runs, r, i, kind, mb, stage)
                    wait = max(0.0, min(b, peer) - a) if peer is not None else 0.0
                    sums["wait"] += wait
                    sums["transfer"] += (b - a) - wait
            inside = sum(b - a for _, _, _, a, b in row["steps"])
            span = row["end"] - row["start"]
            sums["python"] = span - inside
            sums["run"] = span
            step = step_times[warmup + i] if warmup + i < len(step_times) else span
            sums["outside"] = max(0.0, step - span)
            for k, v in sums.items():
                parts[k].append(v)
        per_rank[r] = {k: statistics.median(v) for k, v in parts.items() if v}
    return per_rank


_PEER = {"FWD_SEND": ("FWD_RECV", 1), "FWD_RECV": ("FWD_SEND", -1), "BWD_SEND": ("BWD_RECV", -1),
         "BWD_RECV": ("BWD_SEND", 1)}


def _peer_start(runs, rank, i, kind, mb, stage):
    """Start of the matching transfer step on the other rank in run ``i`` (None if not recorded)."""
    other, _ = _PEER[kind]
    for r, rows in runs.items():
        if r == rank or i >= len(rows):
            continue
        for k, m, s, a, b in rows[i]["steps"]:
            if k == other and m == mb and _matches(kind, stage, s):
                return a
    return None


def _matches(kind, stage, other_stage):
    if kind == "FWD_SEND":
        return other_stage == stage + 1
    if kind == "FWD_RECV":
        return other_stage == stage - 1
    if kind == "BWD_SEND":
        return other_stage == stage - 1
    return other_stage == stage + 1


# ---- table ------------------------------------------------------------------------------------------
def summarise(name, mode, result, warmup):
    times = result["step_times"]
    timed = times[warmup:] or times
    med = statistics.median(timed)
    row = {"config": name, "mode": mode, "workers": CONFIGS[name][0], "median_s": med,
           "tokens_per_s": GLOBAL_BATCH * SEQ / med, "step_times": times,
           "peak_rss_mb": {r: v / 2 ** 20 for r, v in result["rss"].items()}}
    if result.get("traces"):
        row["breakdown_s"] = breakdown(result["traces"], times, warmup)
    if result.get("cpu"):
        row["cpu"] = result["cpu"]
    if "torch" in result:
        row["torch"] = result["torch"]
    if "params" in result:
        row["params"] = result["params"]
    if "losses" in result:
        row["losses"] = result["losses"]
    return row


def print_table(rows):
    base = {r["mode"]: r["median_s"] for r in rows if r["config"] == "1proc"}
    ref = {r["mode"]: r["losses"] for r in rows if r["config"] == "1proc" and r.get("losses")}
    for r in rows:   # parity: the same global batch gives the same losses as one process
        if r.get("losses") and r["mode"] in ref and r["config"] not in ("1proc", "1proc_noclip"):
            r["max_rel_loss_diff"] = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref[r["mode"]]))
    meds = {(r["config"], r["mode"]): r["median_s"] for r in rows}
    head = (f"{'config':<13}{'mode':<9}{'ranks':>6}{'s/step':>8}{'vs 1proc':>9}{'tokens/s':>9}{'loss diff':>10}  "
            f"{'peak RSS MB per rank':<26}step times (s)")
    print(head)
    print("-" * (len(head) + 20))
    for r in rows:
        ratio = r["median_s"] / base[r["mode"]] if r["mode"] in base else float("nan")
        r["ratio_to_1proc"] = ratio
        rss = " ".join(f"{v:.0f}" for v in r["peak_rss_mb"].values())
        steps = " ".join(f"{t:.2f}" for t in r["step_times"])
        diff = f"{r['max_rel_loss_diff']:.0e}" if "max_rel_loss_diff" in r else "-"
        cpu = r.get("cpu")
        cpu = ("  cpu/step " + " ".join(f"{v:.2f}" for v in cpu["cpu_s_per_step"].values()) + " s, cpu/wall "
               + " ".join(f"{v:.2f}" for v in cpu["cpu_per_wall"].values())) if cpu else ""
        print(f"{r['config']:<13}{r['mode']:<9}{r['workers']:>6}{r['median_s']:>8.3f}{ratio:>8.2f}x{r['tokens_per_s']:>9.0f}"
              f"{diff:>10}  {rss:<26}{steps}{cpu}")
    for mode in sorted({r["mode"] for r in rows}):
        for ours, name in OVERHEAD:
            if (ours, mode) in meds and (name, mode) in meds:
                print(f"overhead {mode}: {ours} / {name} MindSpore = {meds[(ours, mode)] / meds[(name, mode)]:.2f}x")
    pp = [r for r in rows if r.get("breakdown_s")]
    if pp:
        print()
        print("pipeline step breakdown (median over timed steps, ms; transfer = both ranks in the transfer, wait = "
              "for the peer to get there, python = inside the schedule run between steps, outside = the rest of the "
              "step: optimizer, loss sharing, data, logging)")
        head = f"{'config':<13}{'mode':<9}{'rank':>5}{'step':>8}{'forward':>9}{'backward':>9}{'transfer':>9}{'wait':>8}{'python':>8}{'outside':>8}"
        print(head)
        print("-" * len(head))
        for r in pp:
            if "timeline_bubble" in r:
                print(f"{r['config']:<13}{r['mode']:<9} bubble of the last recorded step: measured "
                      f"{r['timeline_bubble']:.3f}, simulator with its mean step costs {r['simulated_bubble']:.3f}, "
                      f"replayed with each step's time {r.get('replay_steps_bubble', float('nan')):.3f}, and each "
                      f"transfer's {r.get('replay_p2p_bubble', float('nan')):.3f}; "
                      f"timeline {os.path.relpath(r['timeline_svg'], ROOT)}")
            for rank, b in r["breakdown_s"].items():
                print(f"{r['config']:<13}{r['mode']:<9}{rank:>5}{r['median_s'] * 1e3:>8.0f}{b['forward'] * 1e3:>9.0f}"
                      f"{b['backward'] * 1e3:>9.0f}{b['transfer'] * 1e3:>9.0f}{b['wait'] * 1e3:>8.0f}"
                      f"{b['python'] * 1e3:>8.0f}{b['outside'] * 1e3:>8.0f}")


def save_timeline_svg(row, traces, path):
    """The last recorded iteration of a pipeline row as an SVG timeline (milliseconds)."""
    from mindformers_core.pipeline.render import mean_step_costs, parse_trace_rows, timeline_from_trace
    from mindformers_core.pipeline.svg import save_svg
    last = {int(r): parse_trace_rows(runs[-1]["steps"], f"rank {r}") for r, runs in traces.items() if runs}
    timeline = timeline_from_trace(last, iteration=-1, scale=1e3)
    save_svg(path, timeline, title=f"{row['config']} {row['mode']}: measured pipeline step (trainer)", time_unit="ms")
    row["timeline_svg"], row["timeline_bubble"] = path, timeline.bubble_ratio
    # the simulator fed this iteration's mean step costs (BWD_WEIGHT ~0 without recompute: its work
    # is done at BWD_INPUT)
    from mindformers_core.pipeline import simulate
    from bench.pipeline import schedule_of
    costs = mean_step_costs(timeline)
    sched = schedule_of("zbv" if row["config"].endswith("zbv") else "1f1b", 4, 2)
    kwargs = {}
    if "BWD_INPUT" in costs:
        kwargs = {"bwd_input_time": costs["BWD_INPUT"], "bwd_weight_time": max(costs.get("BWD_WEIGHT", 0.0), 1e-6)}
    bwd = costs.get("BWD") or costs.get("BWD_INPUT", 0.0) + costs.get("BWD_WEIGHT", 0.0)
    sim = simulate(sched, fwd_time=costs["FWD"], bwd_time=bwd, comm_time=costs["comm"], **kwargs)
    row["simulated_bubble"] = sim.bubble_ratio
    row.update(replayed_bubbles(sched, traces))


def replayed_bubbles(sched, traces):
    """What separates the measured bubble from the simulator's (bench/pipeline.py's replays, on the
    last recorded iteration): ``replay_steps``: the order replayed with every compute step's own
    measured time (per stage and microbatch: stage imbalance in, one F/B cost out) and the fastest
    transfer; ``replay_p2p``: also every send/recv pair's own transfer (both ranks there, waiting
    taken out). What the measurement has beyond ``replay_p2p`` is Python and waiting in between."""
    from mindformers_core.pipeline.render import parse_trace_rows
    from bench.pipeline import simulated_per_step
    runs = {int(r): [parse_trace_rows(rows[-1]["steps"], f"rank {r}")] for r, rows in traces.items() if rows}
    comm = min((b - a for rr in runs.values() for run in rr for st, a, b in run if st.type.is_p2p), default=0.0)
    try:
        return {"replay_steps_bubble": simulated_per_step(sched, runs, comm)[0],
                "replay_p2p_bubble": simulated_per_step(sched, runs)[0]}
    except KeyError as e:      # a step of the order missing from the trace
        return {"replay_error": f"step {e} not in the trace"}


def uptime() -> str:
    """``uptime``'s line (the machine's load when the figures were taken)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def summary_rows(rows):
    """Per (config, mode) over the repeats: the median and min-max of the row medians and of the
    ratios to ``1proc`` (paired by repeat; unpaired repeats use the median 1proc)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["config"], r["mode"]), []).append(r)
    base = {k[1]: v for k, v in groups.items() if k[0] == "1proc"}
    out = []
    for (name, mode), rs in groups.items():
        meds = [r["median_s"] for r in rs]
        ones = {r.get("repeat"): r["median_s"] for r in base.get(mode, [])}
        one_med = statistics.median(ones.values()) if ones else float("nan")
        ratios = [r["median_s"] / ones.get(r.get("repeat"), one_med) for r in rs]
        item = {"config": name, "mode": mode, "runs": len(rs), "median_s": statistics.median(meds),
                "min_s": min(meds), "max_s": max(meds), "ratio": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios),
                "max_rel_loss_diff": max((r.get("max_rel_loss_diff", 0.0) for r in rs), default=0.0),
                "peak_rss_mb": max((max(r["peak_rss_mb"].values()) for r in rs if r["peak_rss_mb"]), default=0.0),
                "step_times": [r["step_times"] for r in rs]}
        cpus = [r["cpu"] for r in rs if r.get("cpu")]
        if cpus:
            # per process CPU seconds per step and CPU/wall: median over the repeats, rank by rank
            item["cpu_s_per_step"] = {k: statistics.median(c["cpu_s_per_step"][k] for c in cpus if k in c["cpu_s_per_step"])
                                      for k in cpus[0]["cpu_s_per_step"]}
            item["cpu_per_wall"] = {k: statistics.median(c["cpu_per_wall"][k] for c in cpus if k in c["cpu_per_wall"])
                                    for k in cpus[0]["cpu_per_wall"]}
            item["cpu_per_wall_min_max"] = [min(min(c["cpu_per_wall"].values()) for c in cpus),
                                            max(max(c["cpu_per_wall"].values()) for c in cpus)]
        for key in ("timeline_bubble", "simulated_bubble", "replay_steps_bubble", "replay_p2p_bubble"):
            if any(key in r for r in rs):
                item[key] = [r.get(key) for r in rs]
        out.append(item)
    return out


def print_summary(summary):
    print()
    print("over the repeats: median of the per-run medians [min-max], ratio to 1proc of the same run")
    head = f"{'config':<13}{'mode':<9}{'runs':>5}{'s/step':>8}  {'min-max':<13}{'ratio':>7}  {'min-max':<12}{'loss diff':>10}"
    print(head)
    print("-" * len(head))
    for r in summary:
        print(f"{r['config']:<13}{r['mode']:<9}{r['runs']:>5}{r['median_s']:>8.3f}  "
              f"{r['min_s']:.3f}-{r['max_s']:.3f}  {r['ratio']:>6.2f}x  {r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
              f"{r['max_rel_loss_diff']:>12.0e}")
    for r in summary:
        if r.get("timeline_bubble"):
            fmt = lambda xs: " ".join("-" if x is None else f"{x:.3f}" for x in xs) or "-"   # noqa: E731
            print(f"{r['config']} {r['mode']} bubble per run: measured {fmt(r['timeline_bubble'])}, simulator "
                  f"{fmt(r['simulated_bubble'])}, replayed steps {fmt(r.get('replay_steps_bubble', []))}, "
                  f"+ transfers {fmt(r.get('replay_p2p_bubble', []))}")
    for mode in sorted({r["mode"] for r in summary}):
        for ours, name in OVERHEAD:
            one = next((r for r in summary if r["config"] == ours and r["mode"] == mode), None)
            plain = next((r for r in summary if r["config"] == name and r["mode"] == mode), None)
            if one and plain:
                print(f"overhead {mode}: {ours} / {name} MindSpore = {one['median_s'] / plain['median_s']:.2f}x "
                      f"(per run {one['min_s'] / plain['max_s']:.2f}-{one['max_s'] / plain['min_s']:.2f})")


def peer_comparison(summary):
    """Per row of a peer: our ratio to one process (each mode) next to the peer's (PyTorch's; MindFormers' on
    its one row), and the CPU seconds per step summed over the processes:
    [{config, peer, ours: {mode: ...}, torch: ...}] (``torch``: the peer's view, whichever peer)."""
    out = []
    for peer, names in PEERS.items():
        for name in names:
            theirs = next((r for r in summary if r["config"] == name and r["mode"] == peer), None)
            if theirs is None:
                continue
            item = {"config": name, "peer": peer, "ours": {}}
            for r in summary:
                if r["config"] == name and r["mode"] not in PEERS:
                    item["ours"][r["mode"]] = _ratio_view(r)
            item["torch"] = _ratio_view(theirs)
            out.append(item)
    return out


def _ratio_view(r):
    return {"ratio": r["ratio"], "ratio_min": r["ratio_min"], "ratio_max": r["ratio_max"], "median_s": r["median_s"],
            "cpu_s_per_step": sum(r.get("cpu_s_per_step", {}).values()) or None,
            "cpu_per_wall": r.get("cpu_per_wall")}


def print_peer(comparison):
    if not comparison:
        return
    print()
    print("ours vs the peers (PyTorch: bench/torch_peer.py; MindFormers 2.1.0's legacy Llama: bench/mindformers_peer.py), "
          "ratio to one process of the same run [min-max over repeats], s/step, CPU s per step summed over the processes")
    for item in comparison:
        parts = []
        for mode, v in sorted(item["ours"].items()) + [(item.get("peer", PEER), item["torch"])]:
            cpu = f", cpu {v['cpu_s_per_step']:.2f} s" if v["cpu_s_per_step"] else ""
            parts.append(f"{mode} {v['ratio']:.2f}x [{v['ratio_min']:.2f}-{v['ratio_max']:.2f}] "
                         f"{v['median_s']:.3f} s{cpu}")
        if item.get("peer") == MF_PEER:        # one row: its step time against ours is the comparison
            parts += [f"mindformers / ours {mode} {item['torch']['median_s'] / v['median_s']:.2f}x"
                      for mode, v in sorted(item["ours"].items())]
        print(f"{item['config']:<6} " + "  |  ".join(parts))


def merge(paths, out):
    """``--merge``: the rows of several runs of this bench (one JSON each) summarised together."""
    rows = []
    for i, path in enumerate(paths):
        with open(path) as f:
            for r in json.load(f)["rows"]:
                r["repeat"] = f"{i}:{r.get('repeat', 0)}"
                rows.append(r)
    summary = summary_rows(rows)
    print_summary(summary)
    peer = peer_comparison(summary)
    print_peer(peer)
    with open(out, "w") as f:
        json.dump({"merged": paths, "summary": summary, "peer": peer, "rows": rows}, f, indent=1)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--modes", nargs="+", default=["jit", "pynative"], choices=["jit", "pynative"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--repeats", type=int, default=1, help="run every row this many times")
    parser.add_argument("--threads", default="default",
                        help="CPU kernel threads per worker: N (MFC_CPU_THREADS; 25 = MindSpore's default) or "
                             "default (the trainer's: cores // workers)")
    parser.add_argument("--runtime-threads", type=int, default=0,
                        help="MindSpore runtime_num_threads per worker (0: MindSpore's default)")
    parser.add_argument("--recompute", action="store_true",
                        help="MFC_PIPELINE_RECOMPUTE=1: pipeline stages recompute their forward in the backward")
    parser.add_argument("--sync-transfers", action="store_true",
                        help="MFC_PIPELINE_SYNC_TRANSFERS=1: a host sync after every pipeline transfer (as before)")
    parser.add_argument("--no-trace", action="store_true", help="pipeline rows without the step recording")
    parser.add_argument("--assets", default=os.path.join(ROOT, "bench", "results", "trainer_assets"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "trainer.json"))
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="summarise earlier runs' JSON files together (writes --out)")
    parser.add_argument("--peer", choices=[PEER, MF_PEER], default=None,
                        help="also run PyTorch's equivalents of the 1proc, dp2, tp2 and pp2 rows (bench/torch_peer.py), "
                             "or MindFormers 2.1.0's legacy Llama as a 1proc row (bench/mindformers_peer.py), "
                             "interleaved with ours, under --peer-python")
    parser.add_argument("--peer-python", default=None,
                        help="interpreter with torch for --peer torch (default: $MFC_TORCH_PYTHON, else python/python3 "
                             "on PATH if torch imports there)")
    parser.add_argument("--plain-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plain-clip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_worker:
        plain_worker(args.plain_worker, args.steps, int(args.threads), clip=args.plain_clip)
        return
    if args.merge:
        merge(args.merge, args.out)
        return
    if args.steps <= args.warmup:
        parser.error(f"--steps={args.steps} must exceed --warmup={args.warmup}")
    if args.threads not in ("default", "auto") and not (args.threads.isdigit() and int(args.threads) > 0):
        parser.error(f"--threads={args.threads!r}: a positive integer or default")
    peer_python = None
    if args.peer == PEER:
        peer_python = torch_python(args.peer_python)
    elif args.peer == MF_PEER:
        peer_python = mindformers_python(args.peer_python)
    paths = assets(args.assets)
    rows = []
    for repeat in range(args.repeats):
        for mode in args.modes:
            for name in args.configs:
                workers, flags = CONFIGS[name]
                start = time.time()
                threads = 0 if args.threads in ("default", "auto") else int(args.threads)
                if flags is None:     # plain: the same number the trainer's default gives one worker
                    result = run_plain(mode, args.steps, threads or max(1, cores()), clip=name == "plain_clip")
                else:
                    trace = name.startswith("pp") and not args.no_trace
                    result = run_job(name, mode, workers, flags, paths, args.steps, threads, trace,
                                     runtime_threads=args.runtime_threads, sync_transfers=args.sync_transfers,
                                     recompute=args.recompute, warmup=args.warmup)
                rows.append(summarise(name, mode, result, args.warmup))
                rows[-1]["repeat"] = repeat
                rows[-1]["load_average"] = os.getloadavg()[0]
                if result.get("traces"):
                    svg = os.path.join(os.path.dirname(args.out), f"trainer_{name}_{mode}_timeline.svg")
                    save_timeline_svg(rows[-1], result["traces"], svg)
                print(f"# {name} {mode} run {repeat + 1}/{args.repeats}: {time.time() - start:.0f} s wall, "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
                # the peer's row right after ours (once per repeat: torch has no jit/PyNative modes)
                if peer_python and name in PEERS[args.peer] and mode == args.modes[0]:
                    start = time.time()
                    if args.peer == MF_PEER:
                        result = run_mindformers(peer_python, args.steps, args.warmup)
                    else:
                        result = run_torch(peer_python, name, args.steps, args.warmup, threads)
                    rows.append(summarise(name, args.peer, result, args.warmup))
                    rows[-1]["repeat"] = repeat
                    rows[-1]["load_average"] = os.getloadavg()[0]
                    print(f"# {name} {args.peer} {result['torch']} run {repeat + 1}/{args.repeats}: "
                          f"{time.time() - start:.0f} s wall, load average {os.getloadavg()[0]:.1f}", flush=True)
    print()
    print(f"Llama hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, FFN {FFN}, seq {SEQ}, vocab {VOCAB}, global batch "
          f"{GLOBAL_BATCH}; median of steps {args.warmup + 1}..{args.steps}; kernel threads "
          f"{args.threads}, runtime threads {args.runtime_threads or 'default'}"
          f"{'; transfers synced' if args.sync_transfers else ''}{'; stages recompute' if args.recompute else ''}"
          f"; load average {os.getloadavg()[0]:.1f}")
    for repeat in range(args.repeats):
        print_table([r for r in rows if r["repeat"] == repeat])
    summary = summary_rows(rows)
    if args.repeats > 1:
        print_summary(summary)
    peer = peer_comparison(summary)
    print_peer(peer)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "uptime": uptime(), "rows": rows, "summary": summary, "peer": peer}, f,
                  indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
