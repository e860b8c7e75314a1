"""PyTorch's equivalents of bench/trainer.py's rows, for ``bench/trainer.py --peer torch``.

Runs under ANOTHER interpreter than the project's (one where ``import torch`` works; torch is a
bench-only extra, never a dependency of mindformers_core or its tests), so it imports nothing from
the project: bench/trainer.py passes the sizes on the command line and reads one line
``TORCH_RESULT {json}`` from stdout.

Rows (the same Llama as bench/trainer.py's ``plain`` row: RMSNorm, rotary attention, SwiGLU FFN,
cross entropy; AdamW lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.01; gradients clipped to
global norm 1.0 as the trainer's default ``max_grad_norm: 1.0``; fp32; gloo on CPU):

* ``1proc``: one process;
* ``dp2``: ``DistributedDataParallel``, 2 processes, half the global batch each;
* ``tp2``: DTensor tensor parallel (``parallelize_module``): q/k/v/gate/up column-wise, o/down
  row-wise, the embedding split over the vocabulary, the head column-wise with ``loss_parallel``;
* ``pp2``: ``torch.distributed.pipelining`` ``Schedule1F1B``, 2 stages (embedding + first half of
  the layers; the rest + norm + head), 4 microbatches of global_batch/4 rows.

Per rank: the step times (wall, the optimizer included, a host sync at the loss), and the CPU
seconds (user + sys, ``resource.getrusage``) and wall seconds over the timed steps, so that a
rank spinning while it waits shows as CPU/wall near 1. Rank 0's step times are the row's, as in
bench/trainer.py (rank 0's ``loss.jsonl``).

    /path/to/torch-venv/bin/python bench/torch_peer.py --config dp2 --steps 10 --warmup 2 \\
        --hidden 256 --layers 4 --heads 4 --ffn 1024 --seq 128 --vocab 1024 --batch 8 --threads 1
"""
import argparse
import json
import math
import os
import resource
import socket
import sys
import time

WORKERS = {"1proc": 1, "dp2": 2, "tp2": 2, "pp2": 2}
MICROBATCHES = 4


def build_model(a):
    import torch
    from torch import nn
    import torch.nn.functional as F
    head_dim = a.hidden // a.heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(a.hidden))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * self.weight

    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(a.seq, dtype=torch.float32), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    mask = torch.triu(torch.full((a.seq, a.seq), -1e9), 1)

    def rotate(x):
        half = head_dim // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.q, self.k, self.v, self.o = (nn.Linear(a.hidden, a.hidden, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(a.hidden, a.ffn, bias=False), nn.Linear(a.hidden, a.ffn, bias=False)
            self.down = nn.Linear(a.ffn, a.hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.norm1(x)
            # -1 heads: under tensor parallel each rank holds its share of the heads
            q = self.q(h).view(b, s, -1, head_dim).transpose(1, 2)
            k = self.k(h).view(b, s, -1, head_dim).transpose(1, 2)
            v = self.v(h).view(b, s, -1, head_dim).transpose(1, 2)
            q, k = rotate(q), rotate(k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + mask
            att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
            x = x + self.o(att)
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(a.vocab, a.hidden)
            self.layers = nn.ModuleDict({str(i): Layer() for i in range(a.layers)})
            self.norm = RMSNorm()
            self.head = nn.Linear(a.hidden, a.vocab, bias=False)

        def forward(self, ids):
            x = self.embed(ids) if self.embed is not None else ids
            for layer in self.layers.values():
                x = layer(x)
            return self.head(self.norm(x)) if self.head is not None else x

    torch.manual_seed(0)
    return Llama()


def loss_fn(logits, labels):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def batches(a, steps):
    import torch
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, a.vocab, (a.batch, a.seq), generator=g),
             torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)) for _ in range(steps)]


def clip_(params, max_norm, group=None):
    """Global-norm clipping. With ``group`` the squared norms of the ranks' disjoint parameters
    are summed first (pipeline stages); sharded DTensor gradients (tensor parallel) are summed
    over their shards, plain ones (replicated norms) counted once."""
    import torch
    import torch.distributed as dist
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    sharded = [loc for g, loc in zip(grads, local) if loc is not g]
    sq = torch.stack([loc.pow(2).sum() for loc in local if all(loc is not x for x in sharded)] or
                     [torch.zeros(())]).sum()
    if sharded:
        part = torch.stack([loc.pow(2).sum() for loc in sharded]).sum()
        dist.all_reduce(part)
        sq = sq + part
    if group is not None:
        dist.all_reduce(sq, group=group)
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for loc in local:
        loc.mul_(scale)
    return sq.sqrt()


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(a.threads)
    workers = WORKERS[a.config]
    if workers > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=workers)
    model = build_model(a)
    data = batches(a, a.steps)
    run = {"1proc": one_process, "dp2": ddp, "tp2": dtensor_tp, "pp2": pipelining_1f1b}[a.config]
    step = run(model, a, rank, workers)
    times, losses = [], []
    usage = None
    for i, (ids, labels) in enumerate(data):
        if i == a.warmup:
            usage, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        t0 = time.perf_counter()
        loss = step(ids, labels)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    with open("/proc/self/status") as f:
        hwm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM")), 0)
    queue.put((rank, {"step_times": times, "losses": losses, "cpu_s": cpu, "wall_s": wall, "rss": hwm}))
    if workers > 1:
        dist.barrier()
        dist.destroy_process_group()


def _adamw(params):
    import torch
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


def one_process(model, a, rank, workers):
    opt = _adamw(model.parameters())

    def step(ids, labels):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(ids), labels)
        loss.backward()
        clip_(list(model.parameters()), 1.0)
        opt.step()
        return loss.item()
    return step


def ddp(model, a, rank, workers):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    net = DistributedDataParallel(model)
    opt = _adamw(net.parameters())
    rows = a.batch // workers

    def step(ids, labels):
        opt.zero_grad(set_to_none=True)
        part = slice(rank * rows, (rank + 1) * rows)
        loss = loss_fn(net(ids[part]), labels[part])
        loss.backward()                          # DDP averages the gradients over the ranks
        clip_(list(net.parameters()), 1.0)
        opt.step()
        out = loss.detach().clone()
        dist.all_reduce(out)                     # the trainer logs the global batch's loss
        return out.item() / workers
    return step


def dtensor_tp(model, a, rank, workers):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (workers,))
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(a.layers):
        plan.update({f"layers.{i}.{n}": ColwiseParallel() for n in ("q", "k", "v", "gate", "up")})
        plan.update({f"layers.{i}.{n}": RowwiseParallel() for n in ("o", "down")})
    net = parallelize_module(model, mesh, plan)
    opt = _adamw(net.parameters())

    def step(ids, labels):
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            loss = loss_fn(net(ids), labels)
            loss.backward()
        clip_(list(net.parameters()), 1.0)
        opt.step()
        return loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
    return step


def pipelining_1f1b(model, a, rank, workers):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    half = a.layers // 2
    keep = range(half) if rank == 0 else range(half, a.layers)
    for i in list(model.layers.keys()):
        if int(i) not in keep:
            del model.layers[i]
    if rank == 0:
        model.norm, model.head = None, None
    else:
        model.embed = None
    stage = PipelineStage(model, rank, workers, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    opt = _adamw(model.parameters())
    params = list(model.parameters())

    def step(ids, labels):
        opt.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            sched.step(ids)
        else:
            sched.step(target=labels, losses=losses)
        clip_(params, 1.0, group=dist.group.WORLD)
        opt.step()
        loss = torch.stack(losses).mean() if losses else torch.zeros(())
        dist.broadcast(loss, src=workers - 1)    # every rank reports the step's loss
        return loss.item()
    return step


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, choices=sorted(WORKERS))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per process (0: cores // workers)")
    for name, default in (("hidden", 256), ("layers", 4), ("heads", 4), ("ffn", 1024), ("seq", 128),
                          ("vocab", 1024), ("batch", 8)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error(f"--steps={a.steps} must exceed --warmup={a.warmup}")
    try:
        import torch
        import torch.multiprocessing as mp
        version = torch.__version__
    except ImportError as e:
        sys.exit(f"bench/torch_peer.py: torch does not import in {sys.executable} ({e}); install a CPU build "
                 "there (pip install torch --index-url https://download.pytorch.org/whl/cpu)")
    workers = WORKERS[a.config]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    a.threads = a.threads or max(1, cores // workers)
    if a.config == "pp2" and a.batch % MICROBATCHES:
        p.error(f"--batch={a.batch} must split into {MICROBATCHES} microbatches")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    if workers == 1:
        worker(0, a, 0, queue)
    else:
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, a, port, queue)) for r in range(workers)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        bad = [(i, proc.exitcode) for i, proc in enumerate(procs) if proc.exitcode != 0]
        if bad:
            sys.exit(f"bench/torch_peer.py {a.config}: workers exited {bad}")
    per_rank = dict(queue.get() for _ in range(workers))
    out = {"config": a.config, "torch": version, "threads": a.threads,
           "step_times": per_rank[0]["step_times"], "losses": per_rank[0]["losses"],
           "cpu_s": {r: v["cpu_s"] for r, v in sorted(per_rank.items())},
           "wall_s": {r: v["wall_s"] for r, v in sorted(per_rank.items())},
           "rss": {r: v["rss"] for r, v in sorted(per_rank.items())}}
    print("TORCH_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
