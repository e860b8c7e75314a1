"""Worker side of the context-parallel GPT parity test: the transformer from mindformers_core with
its sequence split over ``cp`` (ring / Ulysses / hybrid attention, optionally with dp or tp),
trained 2 momentum-SGD steps (one layer: the suite runs it in PyNative and jit on 2 and 4 ranks); returns losses and this rank's weight shards for the test to merge."""
import numpy as np
import mindspore as ms

from mindformers_core.common.sequence_placement import to_storage_order
from mindformers_core.distributed import get_env
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import parallelize
from mindformers_core.transformer import (AttentionSpec, ColumnParallelLinear, GPTModel, LayerSpec, RowParallelLinear,
                                          SelfAttention, TransformerConfig)
from mindspore import ops
from tests.bodies.gpt_tp_body import train

STEPS, SEQ, BATCH, VOCAB = 2, 32, 2, 256


def make_config(dp=1, cp=1, tp=1, algo="colossal", ulysses=None, balance=True):
    return TransformerConfig(num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
                             num_query_groups=4, vocab_size=VOCAB, seq_length=SEQ, data_parallel_size=dp,
                             context_parallel_size=cp, tensor_model_parallel_size=tp,
                             context_parallel_algo=algo, ulysses_degree_in_cp=ulysses,
                             context_parallel_load_balance=balance)


class NarrowValueAttention(SelfAttention):
    """Self-attention whose value heads are half as wide as its query/key heads (as multi-latent attention's
    v_head_dim differs from its qk head dim): the attention rule and the context-parallel kernels must
    take v's own head dim."""

    def __init__(self, config, layer_number=1, spec=None):
        super().__init__(config, layer_number, spec)
        self.v_dim = config.head_dim // 2
        self.linear_v = ColumnParallelLinear(config.hidden_size, config.query_groups * self.v_dim, config, bias=False)
        self.linear_proj = RowParallelLinear(config.num_attention_heads * self.v_dim, config.hidden_size, config,
                                             bias=False)

    def construct(self, x, position_ids=None, segment_ids=None):
        b, s = x.shape[0], x.shape[1]
        q = self.linear_q(x).reshape(b, s, -1, self.head_dim)
        k = self.linear_k(x).reshape(b, s, -1, self.head_dim)
        v = self.linear_v(x).reshape(b, s, -1, self.v_dim)
        q = ops.transpose(self.rotate(q, position_ids), (0, 2, 1, 3))
        k = ops.transpose(self.rotate(k, position_ids), (0, 2, 1, 3))
        v = ops.transpose(v, (0, 2, 1, 3))
        return self.linear_proj(self.core_attention(q, k, v))


NARROW_V = LayerSpec(attention=AttentionSpec(module=NarrowValueAttention))


def build(config, narrow_v=False):
    return GPTModel(config, layer_spec=NARROW_V) if narrow_v else GPTModel(config)


def batches():
    rng = np.random.RandomState(7)
    pair = [rng.randint(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(2)]
    return [pair[i % 2] for i in range(STEPS)]


def reference(modes=("pynative",), narrow_v=False):
    out = {}
    for mode in modes:
        ms.set_seed(0)
        model = build(make_config(), narrow_v)
        losses = train(model, batches(), lambda a: a, mode)
        out[mode] = {"losses": losses, "weights": {p.name: p.asnumpy() for p in model.trainable_params()}}
    return out


def run(configs, modes=("pynative", "jit")):
    """``configs``: name -> dict of ``make_config`` keyword arguments, with an optional ``modes`` list
    that replaces ``modes`` for that configuration."""
    rank = get_env().rank
    result = {}
    for name, kw in configs.items():
        kw = dict(kw)
        narrow_v = kw.pop("narrow_v", False)
        for mode in kw.pop("modes", modes):
            ms.set_seed(0)
            config = make_config(**kw)
            model = build(config, narrow_v)
            pos = config.token_positions()
            sample = batches()[0]
            parallelize(model, config, sample[:, :-1], sample[:, 1:])
            layout = sharding_plan_of(model).input_layouts[0]
            shape = sample[:, :-1].shape

            def slicer(a):
                return to_storage_order(a, pos)[layout.local_slice(shape, rank)]

            # inputs and labels are cut from the natural-order tokens, then both put in storage order
            losses = train(model, batches(), slicer, mode)
            shards = {}
            for p in model.trainable_params():
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
            result[f"{name}/{mode}"] = {"losses": losses, "shards": shards,
                                        "plan": sharding_plan_of(model).explain() if mode == "pynative" else ""}
    return result
