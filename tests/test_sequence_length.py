"""``model(ids)`` for any sequence length up to the model's position limit (``config.max_positions``), not only
``seq_length``: the rotary rows and the causal mask follow the input's length, in PyNative and under ``ms.jit``;
a causal model's logits of a shorter input are those of the first tokens of the full one. Past the limit: a
ValueError naming input_ids, the length and the limit. The rotary tables are one copy per model and no layer
holds a seq_length^2 mask; context parallelism keeps its storage-order tables per Cell and refuses another
length by name."""
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindformers_core.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
from mindformers_core.models.hf.pretrained import from_pretrained
from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
from mindformers_core.transformer.attention import DotProductAttention, causal_mask, causal_mask_of_length
from mindformers_core.transformer.rotary import PositionRotary, RotaryEmbedding

S, LIMIT, V = 16, 24, 64
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
_MODELS = {}


def qwen3_like(**kw):
    """Llama with Qwen3's q/k norm, GQA, seq_length 16 and position limit 24."""
    return LlamaConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=V,
                       seq_length=S, ffn_hidden_size=64, qk_layernorm=True, max_position_embeddings=LIMIT, **kw)


def deepseek_like():
    """Multi-latent attention (low-rank q, interleaved rotary pairs, YaRN), dense MLP."""
    return DeepseekV3Config(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=V, seq_length=S,
                            ffn_hidden_size=64, max_position_embeddings=LIMIT, q_lora_rank=16, kv_lora_rank=16,
                            qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8,
                            rotary_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})


def model_of(kind):
    if kind not in _MODELS:
        ms.set_seed(0)
        _MODELS[kind] = (LlamaForCausalLM(qwen3_like()) if kind == "qwen3" else
                         DeepseekV3ForCausalLM(deepseek_like()))
    return _MODELS[kind]


def run(model, mode, *args):
    tensors = [Tensor(a) for a in args]
    if mode == "jit":
        def forward(*t):
            return model(*t)
        return ms.jit(forward)(*tensors).asnumpy()
    return model(*tensors).asnumpy()


def ids_of(length, seed=0):
    return np.random.default_rng(seed).integers(0, V, (2, length)).astype(np.int32)


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("kind", ["qwen3", "deepseek"])
def test_shorter_and_longer_inputs_give_the_full_forwards_logits(kind, mode):
    """Lengths 5 and 16 (= seq_length) are the first tokens of a 24-token forward (the limit, past
    seq_length): causal attention, so the same logits up to fp32 rounding."""
    model = model_of(kind)
    ids = ids_of(LIMIT)
    full = run(model, mode, ids)
    assert full.shape == (2, LIMIT, V)
    for s in (5, S):
        got = run(model, mode, ids[:, :s])
        assert got.shape == (2, s, V)
        assert rel(got, full[:, :s]) <= 1e-5, (kind, mode, s, rel(got, full[:, :s]))


def test_seq_length_input_keeps_its_numbers():
    """A seq_length input rotates by the seq_length tables themselves (the sharding pass's parameters), other
    lengths by rows of the max_positions tables equal to theirs bitwise; the mask built in the graph is the
    constant one bitwise."""
    rotary = model_of("qwen3").decoder.layers[0].self_attention.rotary
    assert rotary.tables(S)[0] is rotary.cos and rotary.tables(S)[1] is rotary.sin
    for s in (1, 5):
        np.testing.assert_array_equal(rotary.tables(s)[0].asnumpy(), rotary.cos.asnumpy()[:s])
        np.testing.assert_array_equal(rotary.tables(s)[1].asnumpy(), rotary.sin.asnumpy()[:s])
    np.testing.assert_array_equal(rotary.cos_all.asnumpy()[:S], rotary.cos.asnumpy())
    for s in (1, 5, S):
        np.testing.assert_array_equal(causal_mask_of_length(s).asnumpy(), causal_mask(s).asnumpy())


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_loss_with_labels_on_a_shorter_input(mode):
    """The mean cross entropy of a 7-token input with labels: the loss of its own logits."""
    model = model_of("qwen3")
    ids, labels = ids_of(7, seed=1), ids_of(7, seed=2)
    loss = float(run(model, mode, ids, labels))
    logits = model(Tensor(ids)).asnumpy().astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, labels[..., None], -1).mean()
    assert loss == pytest.approx(want, rel=1e-5)
    grads = ms.value_and_grad(model, None, model.trainable_params())(Tensor(ids), Tensor(labels))[1]
    assert all(np.isfinite(g.asnumpy()).all() for g in grads)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_past_the_limit_is_a_named_error(mode):
    model = model_of("qwen3")
    with pytest.raises(ValueError, match=r"input_ids has 25 tokens.*max_positions=24"):
        run(model, mode, ids_of(LIMIT + 1))


def test_rotary_past_the_limit_is_a_named_error():
    rotary = RotaryEmbedding(qwen3_like())
    x = Tensor(np.ones((1, LIMIT + 1, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"25 tokens.*max_positions=24"):
        rotary(x)


def test_layers_share_one_rotary_table_and_hold_no_square_mask():
    for kind in ("qwen3", "deepseek"):
        model = model_of(kind)
        rotaries = [c for _, c in model.cells_and_names() if isinstance(c, (RotaryEmbedding, PositionRotary))]
        assert len(rotaries) >= 4
        by_position = [c for c in rotaries if isinstance(c, PositionRotary)]
        plain = [c for c in rotaries if isinstance(c, RotaryEmbedding)]
        assert len({id(c.cos) for c in by_position}) == 1 and len({id(c.sin) for c in by_position}) == 1
        assert len({id(c.cos) for c in plain}) == 1 and len({id(c.cos_all) for c in plain}) == 1
        assert plain[0].cos_all is by_position[0].cos       # the max_positions table: one object
        assert by_position[0].cos.shape == (LIMIT, 1, 8) and plain[0].cos.shape == (S, 1, 8)
        cores = [c for _, c in model.cells_and_names() if isinstance(c, DotProductAttention)]
        assert cores and all(c.mask is None for c in cores)
        for _, cell in model.cells_and_names():
            for value in vars(cell).values():
                if isinstance(value, Tensor) and not isinstance(value, ms.Parameter):
                    assert value.size < S * S, f"{type(cell).__name__} holds a constant of shape {value.shape}"


def test_context_parallel_keeps_per_cell_tables_and_refuses_another_length():
    """Storage order: each Cell its own seq_length tables (the sharding pass slices each); the full length
    runs, another one is refused by name."""
    config = qwen3_like(context_parallel_size=2)
    ms.set_seed(0)
    model = LlamaForCausalLM(config)
    plain = [c for _, c in model.cells_and_names() if isinstance(c, RotaryEmbedding)]
    assert len({id(c.cos) for c in plain}) == len(plain) == 2
    assert not np.array_equal(plain[0].cos.asnumpy(), RotaryEmbedding(qwen3_like()).cos.asnumpy())
    cores = [c for _, c in model.cells_and_names() if isinstance(c, DotProductAttention)]
    assert len({id(c.mask) for c in cores}) == 1 and cores[0].mask.shape == (1, 1, S, S)
    assert model(Tensor(ids_of(S))).shape == (2, S, V)
    with pytest.raises(ValueError, match=r"8 tokens with context_parallel_size=2.*seq_length=16"):
        model(Tensor(ids_of(8)))


def test_from_pretrained_needs_no_seq_length():
    """The Qwen3 fixture folder without seq_length: transformers' logits for its 16 ids and for their first 5;
    the limit is config.json's max_position_embeddings (64)."""
    ref = np.load(os.path.join(DATA, "qwen3", "reference.npz"))
    model = from_pretrained(os.path.join(DATA, "qwen3"))
    assert model.config.max_positions == 64
    for s in (5, ref["input_ids"].shape[1]):
        got = model(Tensor(ref["input_ids"][:, :s].astype(np.int32))).asnumpy()
        assert rel(got, ref["logits"][:, :s]) <= 1e-5
    with pytest.raises(ValueError, match=r"65 tokens.*max_positions=64"):
        model(Tensor(np.zeros((1, 65), np.int32)))
