"""Positions and masks as model inputs (``position_ids``, ``segment_ids``, ``loss_mask``), one process.

The proof the issue asks for: logits with explicit default positions equal the logits of the constant
tables; a row holding two documents with reset positions and segment ids equals the two documents run
apart; the masked loss equals a NumPy masked mean of per-token losses; gradients flow the same way in
PyNative and under ``ms.jit``. The sharding pass keeps the same numbers at dp2 (checked in a msrun job
in tests/test_sharding_parity_msrun.py) -- here the plan's layouts are checked in one process.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.sharding import plan_sharding
from mindformers_core.transformer import GPTModel, TransformerConfig, gpt_layer_spec

B, S, V = 2, 16, 64


def tiny(**kw):
    args = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=V,
                seq_length=S, ffn_hidden_size=48)
    args.update(kw)
    return TransformerConfig(**args)


def model(seed=0, **kw):
    ms.set_seed(seed)
    return GPTModel(tiny(**kw))


def ids(seed=1):
    return np.random.RandomState(seed).randint(0, V, (B, S)).astype(np.int32)


@pytest.fixture(params=["pynative", "jit"])
def call(request):
    """``call(model, *args)``: the model run eagerly, or as one ms.jit function."""
    def run(m, *args):
        args = tuple(None if a is None else Tensor(a) for a in args)
        if request.param == "jit":
            def forward(*a):
                return m(*a)
            return ms.jit(forward)(*args).asnumpy()
        return m(*args).asnumpy()
    return run


def test_explicit_default_positions_equal_the_constant_tables(call):
    m = model()
    x = ids()
    default = call(m, x)
    positions = np.tile(np.arange(S, dtype=np.int32), (B, 1))
    explicit = call(m, x, None, None, positions)
    np.testing.assert_allclose(explicit, default, rtol=1e-5, atol=1e-6)
    segments = np.zeros((B, S), np.int32)
    np.testing.assert_allclose(call(m, x, None, None, positions, segments), default, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(call(m, x, None, None, None, segments), default, rtol=1e-5, atol=1e-6)


def test_shifted_positions_change_the_logits(call):
    """The check above can fail: positions that are not the default ones give other logits."""
    m = model()
    x = ids()
    shifted = np.tile(np.arange(S, dtype=np.int32)[::-1].copy(), (B, 1))
    assert np.abs(call(m, x, None, None, shifted) - call(m, x)).max() > 1e-3


@pytest.mark.parametrize("cut", [5, 9])
def test_two_packed_documents_equal_the_documents_run_apart(call, cut):
    """Row = document A (cut tokens) + document B (S - cut tokens), positions restarting at B, segment ids
    0/1: A's and B's logits equal those of A and B each run alone (padded at the end, causal)."""
    m = model()
    x = ids()
    positions = np.concatenate([np.arange(cut), np.arange(S - cut)]).astype(np.int32)
    positions = np.tile(positions, (B, 1))
    segments = np.tile(np.array([0] * cut + [1] * (S - cut), np.int32), (B, 1))
    packed = call(m, x, None, None, positions, segments)
    alone_a = call(m, np.concatenate([x[:, :cut], x[:, :S - cut]], 1))[:, :cut]          # A then filler
    alone_b = call(m, np.concatenate([x[:, cut:], x[:, :cut]], 1))[:, :S - cut]          # B then filler
    np.testing.assert_allclose(packed[:, :cut], alone_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[:, cut:], alone_b, rtol=1e-5, atol=1e-5)
    # without the segment ids B's tokens see A's: the logits differ (the mask is what separates them)
    leaky = call(m, x, None, None, positions)
    assert np.abs(leaky[:, cut:] - alone_b).max() > 1e-3


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_masked_loss_is_the_numpy_masked_mean(call):
    m = model()
    x, labels = ids(1), ids(2)
    mask = (np.random.RandomState(3).rand(B, S) > 0.4).astype(np.float32)
    logits = call(m, x).astype(np.float64)
    per_token = -np.take_along_axis(_log_softmax(logits), labels[..., None].astype(np.int64), -1)[..., 0]
    want = (per_token * mask).sum() / mask.sum()
    got = float(call(m, x, labels, mask))
    assert got == pytest.approx(want, rel=1e-5)
    everything = float(call(m, x, labels))
    assert everything == pytest.approx(per_token.mean(), rel=1e-5)
    assert abs(got - everything) > 1e-4            # the mask matters
    ones = float(call(m, x, labels, np.ones((B, S), np.float32)))
    assert ones == pytest.approx(everything, rel=1e-5)


def test_gradients_with_positions_and_mask_agree_between_modes():
    m = model()
    x, labels = Tensor(ids(1)), Tensor(ids(2))
    mask = Tensor((np.random.RandomState(3).rand(B, S) > 0.4).astype(np.float32))
    positions = Tensor(np.tile(np.concatenate([np.arange(6), np.arange(S - 6)]).astype(np.int32), (B, 1)))
    segments = Tensor(np.tile(np.array([0] * 6 + [1] * (S - 6), np.int32), (B, 1)))
    grad_fn = ms.value_and_grad(m, None, m.trainable_params())
    eager_loss, eager = grad_fn(x, labels, mask, positions, segments)
    jit_loss, compiled = ms.jit(grad_fn)(x, labels, mask, positions, segments)
    assert float(jit_loss.asnumpy()) == pytest.approx(float(eager_loss.asnumpy()), rel=1e-6)
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-7)
    assert any(np.abs(g.asnumpy()).max() > 0 for g in eager)


def test_plan_keeps_positions_split_like_the_batch_and_gathers_them_for_the_mask_under_cp():
    x = ids()
    positions = np.tile(np.arange(S, dtype=np.int32), (B, 1))
    mask = np.ones((B, S), np.float32)
    m = GPTModel(tiny(data_parallel_size=2, tensor_model_parallel_size=2))
    plan = plan_sharding(m, m.config, x, x, mask, positions, positions)
    text = plan.explain()
    assert "rotary_embedding_by_position" in text and "attention_mask" in text
    layouts = [l.describe() for l in plan.input_layouts]
    assert len(set(layouts)) == 1 and "dp" in layouts[0], layouts      # ids, labels, mask, positions, segments
    # under cp (packed documents, tests/test_packing_msrun.py): the positions split like the sequence, gathered
    # over cp into the whole-sequence mask, which the masked context-parallel kernel takes
    cp = GPTModel(tiny(context_parallel_size=2))
    text = plan_sharding(cp, cp.config, x, x, None, positions).explain()
    assert "attention_mask tensor 0: (None, cp) -> (None, None) [all_gather over cp on dim 1]" in text, text
    assert "local kernel: context_parallel_attention" in text


def test_layer_spec_must_be_a_spec_or_spec_function():
    with pytest.raises(TypeError, match="LayerSpec"):
        GPTModel(tiny(), layer_spec=object())
    from mindformers_core.transformer import TransformerLayer
    with pytest.raises(TypeError, match="Cell class"):
        GPTModel(tiny(), layer_spec=TransformerLayer)
    spec = gpt_layer_spec(tiny(), 1)
    assert GPTModel(tiny(), layer_spec=spec).decoder.layers[1].spec is spec
