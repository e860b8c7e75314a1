"""Worker side of bench/moe.py: a GPT with MoE layers (or its dense twin) parallelized over the
msrun ranks (data parallel, experts over ep = all ranks), timed training steps under ms.jit, PyNative
steps with the all-to-all payload counted at the kernels (the variable-count path, then the padded one
forced on the same model) and timed, and the experts' load."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.distributed.comm import exchange as X
from mindformers_core.sharding.expert_parallel import ExpertParallelExperts
from mindformers_core.sharding.annotations import sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig
from mindformers_core.transformer.moe import routers_of

_COUNT = {}


def _reset():
    _COUNT.update(padded=0, padded_buffer=0, variable=0, variable_buffer=0)


def _instrument():
    """Count, per rank, the off-rank payload each all-to-all sends and the buffer its CPU emulation moves
    (PyNative): the padded exchange (SlotAllToAll of distributed/comm/exchange.py and of its backward twin:
    (n - 1) / n of the input sent, n times the input all-reduced) and the variable-count one (AllToAllV:
    the off-rank rows sent; the all-gathered rows, P x the largest send total)."""
    saved = []
    for module in (X, X.backward_twin()):
        cls = module.SlotAllToAll
        orig = cls.construct
        saved.append((cls, "construct", orig))

        def construct(self, x, *rest, _orig=orig):
            if self.n > 1:
                _COUNT["padded"] += int((self.n - 1) / self.n * x.size * x.itemsize)
                _COUNT["padded_buffer"] += self.n * x.size * x.itemsize
            return _orig(self, x, *rest)
        cls.construct = construct
    orig_v = X.AllToAllV.exchange
    saved.append((X.AllToAllV, "exchange", orig_v))

    def exchange(self, x, m):
        if self.n > 1:
            b = X.all_to_all_v_bytes(m, x.itemsize * int(np.prod(x.shape[1:])), self.index)
            _COUNT["variable"] += b["sent"]
            _COUNT["variable_buffer"] += b["emulated"]
        return orig_v(self, x, m)
    X.AllToAllV.exchange = exchange

    def restore():
        for cls, attr, orig in saved:
            setattr(cls, attr, orig)
    return restore


def _variable_analytic(kernels, rank_in_group, h, itemsize=4):
    """Off-rank bytes of one step from the count matrices the layers exchanged: per layer, dispatch sends
    this rank's off-rank rows, combine sends back the off-rank rows it received; the backward the same."""
    total = 0
    for k in kernels:
        c = np.asarray(k.last_counts)
        P = c.shape[0]
        m = c.reshape(P, P, -1).sum(2)
        me = rank_in_group
        total += 2 * (m[me].sum() - m[me, me] + m[:, me].sum() - m[me, me]) * h * itemsize
    return int(total)


def config(kind, dp, ep, h, layers, heads, vocab, seq, experts, topk, expert_ffn):
    common = dict(num_layers=layers, hidden_size=h, num_attention_heads=heads, vocab_size=vocab, seq_length=seq,
                  data_parallel_size=dp)
    if kind == "dense":          # the same active parameters per token: k experts' width
        return TransformerConfig(ffn_hidden_size=topk * expert_ffn, **common)
    return TransformerConfig(ffn_hidden_size=topk * expert_ffn, num_moe_experts=experts, moe_router_topk=topk,
                             moe_ffn_hidden_size=expert_ffn, moe_aux_loss_coeff=0.01, expert_model_parallel_size=ep,
                             **common)


def run(cases, batch, steps, h, layers, heads, vocab, seq, experts, topk, expert_ffn, pynative_steps=1,
        pynative=True):
    env = get_env()
    rank, world = env.rank, env.world_size
    out = {}
    rng = np.random.RandomState(0)
    data = rng.randint(0, vocab, (batch, seq + 1)).astype(np.int32)
    for kind in cases:
        ms.set_seed(0)
        ep = world if kind == "moe" else 1
        cfg = config(kind, world, ep, h, layers, heads, vocab, seq, experts, topk, expert_ffn)
        model = GPTModel(cfg)
        parallelize(model, cfg, data[:, :-1], data[:, 1:])
        layout = sharding_plan_of(model).input_layouts[0]
        sl = layout.local_slice(data[:, :-1].shape, rank)
        ids, labels = Tensor(data[:, :-1][sl]), Tensor(data[:, 1:][sl])
        params = model.trainable_params()
        opt = nn.AdamWeightDecay(params, 1e-3)
        reducer = GradientReducer(params)
        grad_fn = ms.value_and_grad(model, None, params)

        def make_step():        # a new function per jit path: ms.jit traces it anew (jit_variable is read then)
            def step(a, b):
                loss, grads = grad_fn(a, b)
                opt(reducer(grads))
                return loss
            return step

        step = make_step()
        kernels = [c for _, c in model.cells_and_names() if isinstance(c, ExpertParallelExperts)]
        counted = {}
        if pynative:
            restore = _instrument()                     # PyNative steps: count the all-to-all payload
            for path in (("variable", "padded") if kernels else ("dense",)):
                for k in kernels:
                    k.variable = path == "variable"
                _reset()
                step(ids, labels).asnumpy()             # counted (and warm)
                counted[path] = dict(_COUNT)
                if path == "variable":
                    counted[path]["analytic"] = _variable_analytic(kernels, kernels[0].index, h)
                    counted[path]["counts"] = [k.last_counts.tolist() for k in kernels]
                t0 = time.perf_counter()
                for _ in range(pynative_steps):
                    step(ids, labels).asnumpy()
                counted[path]["pynative_step_s"] = (time.perf_counter() - t0) / max(pynative_steps, 1)
            for k in kernels:
                k.variable = True
            restore()
        jit = {}
        for path in (("variable", "padded") if kernels else ("dense",)):
            for k in kernels:
                k.jit_variable = path == "variable"
                k.reset_graph_counts()
            for _, r in routers_of(model):
                r.tokens_per_expert.set_data(Tensor(np.zeros(r.num_experts, np.float32)))
            jitted = ms.jit(make_step())
            t0 = time.perf_counter()
            jitted(ids, labels).asnumpy()               # compile + one step
            first = time.perf_counter() - t0
            row = {"first_call_s": first}
            if path == "variable":
                # what the graph recorded in that one step: each layer's count matrix and its forward off-rank
                # rows (dispatch + combine); the backward moves the same rows back (the exchanges' adjoints)
                recs = [k.graph_counts() for k in kernels]
                row["counted"] = sum(2 * w["sent_rows"] for _, w in recs) * h * 4
                row["analytic"] = _analytic_from(recs, kernels[0].index, h)
                row["buffer"] = sum(2 * w["buffer_rows"] for _, w in recs) * h * 4
                row["counts"] = [c.tolist() for c, _ in recs]
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = jitted(ids, labels)
            loss = float(loss.asnumpy())
            row["step_s"] = (time.perf_counter() - t0) / steps
            row["loss"] = loss
            row["load"] = [r.tokens_per_expert.asnumpy().tolist() for _, r in routers_of(model)]
            jit[path] = row
        main = jit["variable" if kernels else "dense"]
        out[kind] = {"step_s": main["step_s"], "loss": main["loss"], "a2a": counted, "load": main["load"],
                     "jit": jit, "params": int(sum(p.size for p in params))}
    return out


def _analytic_from(records, rank_in_group, h, itemsize=4):
    """Off-rank bytes of one step from the count matrices the graph path recorded (as _variable_analytic)."""
    total = 0
    for c, _ in records:
        P = c.shape[0]
        m = c.reshape(P, P, -1).sum(2)
        me = rank_in_group
        total += 2 * (m[me].sum() - m[me, me] + m[:, me].sum() - m[me, me]) * h * itemsize
    return int(total)
