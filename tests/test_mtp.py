"""Multi-token prediction (transformer/mtp.py) on one process: the loss term against a NumPy computation of the
depths (shift, concat order, masks, average, scale), the shared embedding's gradient, PyNative = jit, and the
bad configs named up front."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.transformer import GPTModel, TransformerConfig, gpt_layer_spec

V, S, H = 32, 8, 16


def cfg(**kw):
    base = dict(num_layers=2, hidden_size=H, num_attention_heads=2, vocab_size=V, seq_length=S,
                ffn_hidden_size=32, mtp_num_layers=1, mtp_loss_scaling_factor=0.3)
    base.update(kw)
    return TransformerConfig(**base)


def rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def ce(logits, labels):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    return lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


def numpy_mtp_term(model, ids, labels, mask):
    """The MTP term, every step but the depth's transformer layer (a tested Cell of its own) in NumPy."""
    c = model.config
    P = {p.name: p.asnumpy().astype(np.float64) for p in model.get_parameters()}
    hidden = model.decoder(model.embedding(Tensor(ids))).asnumpy().astype(np.float64)   # after the final norm
    emb, out = P["embedding.word_embeddings.weight"], P["output_layer.weight"]
    b, s = ids.shape
    losses = []
    for k in range(1, c.mtp_num_layers + 1):
        pre = f"mtp.layers.{c.num_layers + k - 1}."
        idx = np.minimum(np.arange(s) + k, s - 1)
        e = emb[ids[:, idx]]
        x = np.concatenate([rms(e, P[pre + "enorm.weight"]), rms(hidden, P[pre + "hnorm.weight"])], -1)
        x = x @ P[pre + "eh_proj.weight"]
        layer = model.mtp.layers[k - 1].transformer_layer
        x = layer(Tensor(x.astype(np.float32))).asnumpy().astype(np.float64)
        hidden = rms(x, P[pre + "shared_head_norm.weight"])
        tok = ce(hidden @ out, labels[:, idx])
        m = mask[:, idx] * (np.arange(s) + k < s)[None]
        losses.append((tok * m).sum() / m.sum())
    return c.mtp_loss_scaling_factor * np.mean(losses)


@pytest.mark.parametrize("depths", [1, 2])
def test_mtp_term_matches_numpy_with_masked_tokens(depths):
    ms.set_seed(3)
    c = cfg(mtp_num_layers=depths)
    model = GPTModel(c)
    rng = np.random.default_rng(depths)
    ids = rng.integers(0, V, (2, S)).astype(np.int32)
    labels = rng.integers(0, V, (2, S)).astype(np.int32)
    mask = np.ones((2, S), np.float32)
    mask[0, :3] = 0          # a prompt: no loss there
    mask[1, 5] = 0
    total = float(model(Tensor(ids), Tensor(labels), Tensor(mask)))
    main = float(model._head(model.decoder(model.embedding(Tensor(ids))), Tensor(labels), Tensor(mask)))
    want = numpy_mtp_term(model, ids, labels, mask)
    assert abs((total - main) - want) < 1e-5 * max(1.0, abs(want)), (total - main, want)
    assert abs(float(model.mtp.probe.loss_sum.asnumpy()) - want) < 1e-5     # what the step log reads
    # no mask: every position whose target t + k is inside the sequence counts
    model.mtp.probe.loss_sum.set_data(Tensor(np.zeros((), np.float32)))
    total = float(model(Tensor(ids), Tensor(labels)))
    main = float(model._head(model.decoder(model.embedding(Tensor(ids))), Tensor(labels), None))
    want = numpy_mtp_term(model, ids, labels, np.ones((2, S), np.float32))
    assert abs((total - main) - want) < 1e-5 * max(1.0, abs(want))


def test_mtp_weights_are_the_depths_own_and_the_embedding_gets_their_gradient():
    ms.set_seed(4)
    model = GPTModel(cfg())
    names = [p.name for p in model.trainable_params()]
    own = [n for n in names if n.startswith("mtp.")]
    assert "mtp.layers.2.eh_proj.weight" in own and "mtp.layers.2.transformer_layer.mlp.linear_fc2.weight" in own
    assert not any("embedding" in n or "output_layer" in n for n in own)      # shared, not copied
    # the depth's layer is drawn under its own name, not a copy of the last decoder layer
    P = {p.name: p.asnumpy() for p in model.get_parameters()}
    assert not np.allclose(P["mtp.layers.2.transformer_layer.mlp.linear_fc2.weight"],
                           P["decoder.layers.1.mlp.linear_fc2.weight"])
    ids = Tensor(np.random.default_rng(0).integers(0, V, (2, S)).astype(np.int32))
    params = model.trainable_params()
    grad = ms.value_and_grad(model, None, params)
    loss, grads = grad(ids, ids)
    g = dict(zip(names, grads))
    assert float(np.abs(g["mtp.layers.2.eh_proj.weight"].asnumpy()).max()) > 0
    # factor 0: the same model without the MTP term; the embedding's gradient differs by the MTP part
    model.mtp.scale = 0.0
    _, grads0 = ms.value_and_grad(model, None, params)(ids, ids)
    g0 = dict(zip(names, grads0))
    diff = np.abs(g["embedding.word_embeddings.weight"].asnumpy() - g0["embedding.word_embeddings.weight"].asnumpy())
    assert diff.max() > 1e-6
    assert float(np.abs(g0["mtp.layers.2.eh_proj.weight"].asnumpy()).max()) == 0.0
    model.mtp.scale = 0.3
    loss_j, grads_j = ms.jit(grad)(ids, ids)                     # PyNative = jit
    assert abs(float(loss) - float(loss_j)) < 1e-6
    assert max(float(np.abs(a.asnumpy() - b.asnumpy()).max()) for a, b in zip(grads, grads_j)) < 1e-6


def test_mtp_with_tied_embeddings_and_moe_layers():
    ms.set_seed(5)
    c = cfg(tie_word_embeddings=True, num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.01,
            moe_first_k_dense_layers=1, mtp_num_layers=2)
    model = GPTModel(c)
    names = [p.name for p in model.trainable_params()]
    assert "mtp.layers.3.transformer_layer.mlp.experts.w_gate" in names          # built like the last layer (MoE)
    ids = Tensor(np.random.default_rng(1).integers(0, V, (2, S)).astype(np.int32))
    loss, grads = ms.value_and_grad(model, None, model.trainable_params())(ids, ids)
    assert np.isfinite(float(loss)) and float(model.mtp.probe.forwards.asnumpy()) == 1.0


@pytest.mark.parametrize("kw, field", [
    (dict(mtp_num_layers=-1), "mtp_num_layers=-1"),
    (dict(mtp_num_layers=1.5), "mtp_num_layers=1.5"),
    (dict(mtp_loss_scaling_factor=-0.1), "mtp_loss_scaling_factor=-0.1"),
    (dict(pipeline_model_parallel_size=2, tie_word_embeddings=True), "tie_word_embeddings=True"),
])
def test_bad_mtp_configs_are_named(kw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        cfg(**kw)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_shift_follows_the_context_parallel_storage_order(k):
    """Under load-balanced cp2 the sequence is held in storage order (slots 0..15 hold tokens 0-3, 12-15, 4-7, 8-11):
    depth k's index takes each slot to the slot of the token k later, and a slot is past the end when its token
    is among the last k, so a sequence in storage order shifted by the index, put back in token order, is the
    token-order sequence shifted by k (NumPy)."""
    from mindformers_core.common.sequence_placement import from_storage_order, to_storage_order
    from mindformers_core.transformer.mtp import MultiTokenPredictionLayer, shifted_index
    seq = 16
    c = cfg(seq_length=seq, context_parallel_size=2, mtp_num_layers=1)
    pos = np.asarray(c.token_positions())
    assert list(pos[:8]) == [0, 1, 2, 3, 12, 13, 14, 15]
    tokens = np.arange(100, 100 + seq)[None]
    stored = to_storage_order(tokens, pos)
    index = shifted_index(seq, k, pos)
    want = np.minimum(np.arange(seq) + k, seq - 1) + 100
    assert np.array_equal(from_storage_order(stored[:, index], pos)[0], want)
    layer = MultiTokenPredictionLayer(c, k, gpt_layer_spec, GPTModel(c).embedding.word_embeddings.weight)
    assert np.array_equal(layer.shift_index.asnumpy(), index)
    assert np.array_equal(from_storage_order(layer.in_range.asnumpy(), pos)[0], np.arange(seq) + k < seq)


def test_mtp_names_map_to_deepseek_checkpoint_names_and_back():
    """Every MTP weight of a MoE model with 2 depths has a Hugging Face name model.layers.{num_layers + k - 1}.*
    (DeepSeek's: enorm, hnorm, eh_proj transposed, shared_head.norm, the layer's own weights, experts stacked);
    our state -> Hugging Face names -> ours is exact; DeepSeek's embedding/head copies are ignored."""
    from mindformers_core.models.llama.hf import LAYER_MAP, TOP_MAP
    from mindformers_core.models.mtp_names import SHARED_COPIES, mtp_rules
    from mindformers_core.models.state_dict import NameRule, StackedRule, StateDictAdapter, layer_rules
    experts = {"mlp.experts.w_gate": ("mlp.experts.{e}.gate_proj.weight", True),
               "mlp.experts.w_up": ("mlp.experts.{e}.up_proj.weight", True),
               "mlp.experts.w_down": ("mlp.experts.{e}.down_proj.weight", True)}
    moe = {"mlp.router.weight": ("mlp.gate.weight", True)}
    adapter = StateDictAdapter(
        [NameRule(o, h, t) for o, (h, t) in TOP_MAP.items()]
        + layer_rules("decoder.layers.{i}.", "model.layers.{i}.", {**LAYER_MAP, **moe})
        + [StackedRule("decoder.layers.{i}." + o, "model.layers.{i}." + h, t) for o, (h, t) in experts.items()]
        + mtp_rules({**LAYER_MAP, **moe}, experts), ignored=SHARED_COPIES)
    ms.set_seed(6)
    model = GPTModel(cfg(num_moe_experts=4, moe_router_topk=2, moe_first_k_dense_layers=1, mtp_num_layers=2))
    state = {p.name: p.asnumpy() for p in model.trainable_params()}
    hf = adapter.to_hf(state)
    assert hf["model.layers.2.eh_proj.weight"].shape == (H, 2 * H)
    assert {"model.layers.2.enorm.weight", "model.layers.3.hnorm.weight", "model.layers.3.shared_head.norm.weight",
            "model.layers.2.self_attn.q_proj.weight", "model.layers.3.mlp.experts.3.down_proj.weight",
            "model.layers.3.mlp.gate.weight"} <= set(hf)
    np.testing.assert_array_equal(hf["model.layers.2.eh_proj.weight"], state["mtp.layers.2.eh_proj.weight"].T)
    back = {adapter.ours_of_hf(n) for n in hf if ".enorm." in n or ".eh_proj." in n}
    assert back == {"mtp.layers.2.enorm.weight", "mtp.layers.3.enorm.weight", "mtp.layers.2.eh_proj.weight",
                    "mtp.layers.3.eh_proj.weight"}
    for name, array in state.items():       # read back through the table (a checkpoint load's path)
        got = adapter.read(name, array.shape, [(0, n) for n in array.shape], lambda h, sl: hf[h][tuple(sl)])
        np.testing.assert_array_equal(got, array)
    assert adapter.ours_of_hf("model.layers.2.embed_tokens.weight") is None
    assert adapter.ours_of_hf("model.layers.3.shared_head.head.weight") is None


def test_deepseek_v3_mtp_layer_saved_and_loaded_under_deepseeks_names(tmp_path):
    """DeepseekV3ForCausalLM (the tiny transformers fixture's config) with one MTP depth: its MTP layer (MLA + MoE,
    like its last layer) is exported as model.layers.3.* and a folder holding them loads back exactly; the
    fixture itself (transformers drops MTP layers) is refused naming the missing model.layers.3 tensors."""
    import os
    from mindformers_core.models.hf.config import read_hf_config
    from mindformers_core.models.hf.export import export_folder
    from mindformers_core.models.hf.pretrained import from_pretrained
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "deepseek_v3")
    spec, config, _ = read_hf_config(fixture)
    ms.set_seed(7)
    model = spec.model_class(spec.config_class.from_model_config(dict(config, seq_length=16, mtp_num_layers=1)))
    state = {p.name: p.asnumpy() for p in model.get_parameters() if p.requires_grad or "expert_bias" in p.name}
    out = str(tmp_path / "with_mtp")
    import json
    with open(os.path.join(fixture, "config.json")) as f:
        export_folder(out, state, spec.state_dict_adapter, json.load(f))
    names = set(spec.state_dict_adapter.to_hf(state))
    assert {"model.layers.3.enorm.weight", "model.layers.3.eh_proj.weight", "model.layers.3.shared_head.norm.weight",
            "model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "model.layers.3.mlp.experts.7.down_proj.weight",
            "model.layers.3.mlp.gate.e_score_correction_bias"} <= names
    loaded = from_pretrained(out, seq_length=16, mtp_num_layers=1)
    for p in loaded.get_parameters():
        if p.name in state:
            np.testing.assert_array_equal(p.asnumpy(), state[p.name], err_msg=p.name)
    ids = Tensor(np.random.default_rng(2).integers(0, 320, (2, 16)).astype(np.int32))
    assert float(loaded(ids, ids)) == float(model(ids, ids))
    with pytest.raises(Exception, match=r"model\.layers\.3\.enorm\.weight"):
        from_pretrained(fixture, seq_length=16, mtp_num_layers=1)


def test_pipeline_stages_with_mtp_equal_the_whole_model():
    """pp2 in one process: the last stage holds a copy of the embedding (same name, same values) and takes the ids
    as ``token_ids``; its loss is the whole model's, and the two copies' embedding gradients sum to the whole
    model's (what the pipeline runtime's ``_sum_tied`` does between the ranks)."""
    ms.set_seed(3)
    whole = GPTModel(cfg())
    first, last = GPTModel(cfg(pipeline_model_parallel_size=2), pp_rank=0), \
        GPTModel(cfg(pipeline_model_parallel_size=2), pp_rank=1)
    assert last.embedding_copy and not first.embedding_copy and not first.has_mtp
    name = "embedding.word_embeddings.weight"
    table = {p.name: p for p in last.trainable_params()}[name]
    assert np.array_equal(table.asnumpy(), {p.name: p for p in whole.trainable_params()}[name].asnumpy())
    ids = Tensor(np.random.default_rng(1).integers(0, V, (2, S)).astype(np.int32))
    loss, grads = ms.value_and_grad(whole, None, whole.trainable_params())(ids, ids)
    hidden = first(ids)
    staged, (d_hidden, last_grads) = ms.value_and_grad(lambda h: last(h, ids, None, None, None, ids), 0,
                                                       last.trainable_params())(hidden)
    _, first_grads = ms.value_and_grad(lambda x: (first(x) * d_hidden).sum(), None, first.trainable_params())(ids)
    assert abs(float(staged) - float(loss)) < 1e-6 * float(loss)

    def grad_of(model, gs):
        return gs[[p.name for p in model.trainable_params()].index(name)].asnumpy()
    want = grad_of(whole, grads)
    summed = grad_of(first, first_grads) + grad_of(last, last_grads)
    assert np.abs(summed - want).max() < 1e-6 * np.abs(want).max()
    assert np.abs(grad_of(last, last_grads)).max() > 1e-3 * np.abs(want).max()     # the MTP depth's share
