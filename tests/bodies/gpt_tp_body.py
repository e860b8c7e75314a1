"""Worker side of the tensor-parallel GPT parity test: the transformer from mindformers_core,
parallelized by its own shard() declarations, trained 3 momentum-SGD steps (batches a, b, a: the third step proves the carry of the momentum
and weights as the earlier 5 did, and its loss is below the first); returns losses and this rank's
weight shards (with their global slices) for the test to merge."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig

STEPS = 3


def make_config(dp=1, tp=1, sequence_parallel=False):
    return TransformerConfig(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
                             num_query_groups=4, vocab_size=256, seq_length=16, data_parallel_size=dp,
                             tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel)


def batches(batch=4, seq=16, vocab=256):
    """Two random batches alternating: the third step sees the first batch again, and its loss is lower."""
    rng = np.random.RandomState(5)
    pair = [rng.randint(0, vocab, (batch, seq + 1)).astype(np.int32) for _ in range(2)]
    return [pair[i % 2] for i in range(STEPS)]


def packed_inputs(batch=4, seq=16):
    """loss_mask, position_ids, segment_ids of packed rows: two documents per row, cut at a different place
    in each row, the first few tokens of each row masked out of the loss (a prompt)."""
    cuts = [5, 9, 3, 12][:batch]
    positions = np.stack([np.concatenate([np.arange(c), np.arange(seq - c)]) for c in cuts]).astype(np.int32)
    segments = np.stack([np.array([0] * c + [1] * (seq - c)) for c in cuts]).astype(np.int32)
    mask = np.ones((batch, seq), np.float32)
    for row, c in enumerate(cuts):
        mask[row, :2 + row] = 0.0
    return mask, positions, segments


def train(model, data, slicer, mode, packed=False):
    params = model.trainable_params()
    # Momentum, not Adam: Adam divides by sqrt(v) + eps, which turns fp32 reduction-order noise
    # (~1e-7 relative in the gradients) on elements with |g| ~ eps into ~1e-3 weight differences
    # after 5 steps (measured); the gradients themselves agree to < 1e-6.
    opt = nn.Momentum(params, learning_rate=0.5, momentum=0.9)
    reducer = GradientReducer(params)
    grad_fn = ms.value_and_grad(model, None, params)

    def step(*batch):
        loss, grads = grad_fn(*batch)
        opt(reducer(grads))
        return loss

    run = ms.jit(step) if mode == "jit" else step
    extras = [slicer(a) for a in packed_inputs()] if packed else []
    losses = []
    for tokens in data:
        ids, labels = slicer(tokens[:, :-1]), slicer(tokens[:, 1:])
        losses.append(float(run(*(Tensor(a) for a in [ids, labels] + extras))))
    return losses


def reference(modes=("pynative",), packed=False):
    """Single process, no parallelism: losses and final weights (``packed``: with packed_inputs())."""
    out = {}
    for mode in modes:
        ms.set_seed(0)
        model = GPTModel(make_config())
        losses = train(model, batches(), lambda a: a, mode, packed)
        out[mode] = {"losses": losses, "weights": {p.name: p.asnumpy() for p in model.trainable_params()}}
    return out


def run(configs, modes=("pynative", "jit"), with_reference=False):
    rank = get_env().rank
    result = {}
    if with_reference and rank == 0:
        result["reference"] = reference(modes)
    for name, (dp, tp, sp, *packed) in configs.items():
        packed = bool(packed and packed[0])    # (dp, tp, sp, True): with loss_mask, position_ids, segment_ids
        for mode in modes:
            ms.set_seed(0)
            config = make_config(dp, tp, sp)
            model = GPTModel(config)
            sample = batches()[0]
            parallelize(model, config, sample[:, :-1], sample[:, 1:], *(packed_inputs() if packed else ()))
            layout = sharding_plan_of(model).input_layouts[0]
            shape = sample[:, :-1].shape
            losses = train(model, batches(), lambda a: a[layout.local_slice(shape, rank)], mode, packed)
            shards = {}
            for p in model.trainable_params():
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
            result[f"{name}/{mode}"] = {"losses": losses, "shards": shards,
                                        "redistributions": len(sharding_plan_of(model).redistributions)}
    return result
