"""DeepSeek-V3 against ``transformers`` itself: the tiny random ``DeepseekV3ForCausalLM`` folders that
``scripts/make_hf_fixtures.py`` saved (tests/data/hf/deepseek_v3*: multi-latent attention with q_lora_rank 48 /
kv_lora_rank 32, qk 16 + rope 8, v 16, interleaved rope; layer 0 dense, layers 1-2 with 8 experts top-2 in 2
groups, a nonzero noaux_tc expert bias, routed_scaling_factor 2.5, one shared expert; the same weights with YaRN
factor 4; a plain-q variant). Logits agree to 1e-5 of their largest magnitude (fp32) in PyNative (the compiled
model: greedy ids in tests/test_generation.py), every token picks the experts transformers picked with the same
weights, the folder exports back bitwise, and bad sizes are named before anything is built. No torch, no
transformers here."""
import json
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import get_model_spec
from mindformers_core.models.deepseek_v3 import DeepseekV3Config
from mindformers_core.models.hf.config import read_hf_config, write_hf_config
from mindformers_core.models.hf.export import export_folder
from mindformers_core.models.hf.pretrained import from_pretrained
from mindformers_core.transformer.mla import MultiLatentAttention
from mindformers_core.transformer.moe import TopKRouter
from mindformers_core.transformer.yarn import yarn_inv_freq
from tests.test_hf_models import logits

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
_MODELS = {}


def reference(name):
    return np.load(os.path.join(DATA, name, "reference.npz"))


def model_of(name, **overrides):
    key = (name, tuple(sorted(overrides.items())))
    if key not in _MODELS:
        _MODELS[key] = from_pretrained(os.path.join(DATA, name), seq_length=16, **overrides)
    return _MODELS[key]


def rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


# PyNative here: jit compiles the whole model (~20 s a folder). The compiled model is checked against transformers by
# tests/test_generation.py (the YaRN folder's greedy ids under jit: its prefill is this forward with a cache) and
# against one process by tests/test_deepseek_v3_msrun.py (ep2 fine-tuning under jit)
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v3_yarn", "deepseek_v3_q_full"])
def test_logits_equal_transformers(name):
    ref = reference(name)
    spec, _, _ = read_hf_config(os.path.join(DATA, name))
    assert spec.name == "DeepseekV3ForCausalLM"
    model = model_of(name)
    assert all(isinstance(layer.self_attention, MultiLatentAttention) for layer in model.decoder.layers)
    got = logits(model, ref["input_ids"], "pynative")
    assert got.shape == ref["logits"].shape
    err = rel_err(got, ref["logits"])
    assert err <= 1e-5, f"{name} pynative: max |ours - transformers| / max |transformers| = {err:.2e}"


def test_the_check_can_fail_without_interleaved_pairs_or_yarn():
    """Plain rotate-half instead of DeepSeek's interleaved pairs, or the YaRN folder without its scaling, moves
    the logits far beyond the tolerance: both settings are seen by the comparison."""
    ids = reference("deepseek_v3")["input_ids"]
    assert rel_err(logits(model_of("deepseek_v3", rope_interleave=False), ids, "pynative"),
                   reference("deepseek_v3")["logits"]) > 1e-3
    plain = DeepseekV3Config.from_model_config(dict(read_hf_config(os.path.join(DATA, "deepseek_v3_yarn"))[1],
                                                    seq_length=16, rope_scaling=None))
    assert plain.rotary_scaling is None and plain.softmax_scale == pytest.approx(24 ** -0.5)
    assert rel_err(reference("deepseek_v3")["logits"], reference("deepseek_v3_yarn")["logits"]) > 1e-3


def test_yarn_frequencies_blend_the_original_and_the_interpolated():
    """factor 4 over 16 original positions, rope dim 8, base 1e4: pair 0 (fast) keeps its frequency, the
    others are divided by 4 (the ramp between beta_fast 32 and beta_slow 1 rotations ends at pair 1)."""
    scaling = json.load(open(os.path.join(DATA, "deepseek_v3_yarn", "config.json")))["rope_parameters"]
    freq = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(yarn_inv_freq(8, 10000.0, scaling), freq * np.array([1, 0.25, 0.25, 0.25]))
    config = model_of("deepseek_v3_yarn").config
    m = 0.1 * 0.707 * np.log(4.0) + 1.0
    assert config.softmax_scale == pytest.approx(m * m / np.sqrt(24))


def test_routing_chooses_the_experts_transformers_chose():
    """Sigmoid scores + the expert bias, best group by the sum of its two best, top-2, renormalized x 2.5:
    each token's experts (sorted) equal transformers' in both MoE layers, and their weights to 1e-5."""
    ref = reference("deepseek_v3")
    model = model_of("deepseek_v3")
    routers = [(path, cell) for path, cell in model.cells_and_names() if isinstance(cell, TopKRouter)]
    assert [p.split(".")[2] for p, _ in routers] == ["1", "2"]
    assert all(r.use_bias and r.grouped and r.sigmoid and r.scaling == 2.5 for _, r in routers)
    assert np.abs(routers[0][1].expert_bias.asnumpy()).max() > 0.05        # the folder's nonzero bias is loaded
    seen = {}
    hooks = [cell.register_forward_hook(lambda cell, args, out, layer=p.split(".")[2]: seen.setdefault(layer, out))
             for p, cell in routers]
    try:
        model(ms.Tensor(ref["input_ids"].astype(np.int32)))
    finally:
        for h in hooks:
            h.remove()
    for layer in ("1", "2"):
        weights, index = seen[layer][0].asnumpy().reshape(-1, 2), seen[layer][1].asnumpy().reshape(-1, 2)
        order = np.argsort(index, -1)
        np.testing.assert_array_equal(np.take_along_axis(index, order, -1), ref[f"experts_{layer}"])
        np.testing.assert_allclose(np.take_along_axis(weights, order, -1), ref[f"expert_weights_{layer}"],
                                   rtol=1e-5, atol=1e-6)


def test_export_gives_back_the_folder_bitwise(tmp_path):
    """Our weights (and the expert bias) through the family's table and config.json writer: the same tensors,
    bit for bit, and a config.json that reads back to the same model config."""
    from safetensors.numpy import load_file
    folder = os.path.join(DATA, "deepseek_v3_yarn")
    spec = get_model_spec("DeepseekV3ForCausalLM")
    model = model_of("deepseek_v3_yarn")
    state = {p.name: p.asnumpy() for p in model.get_parameters()
             if p.requires_grad or p.name.endswith("expert_bias")}
    out = export_folder(str(tmp_path / "hf"), state, spec.state_dict_adapter, write_hf_config(spec, model.config))
    ours, theirs = load_file(os.path.join(out, "model.safetensors")), load_file(os.path.join(folder, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    assert all(ours[k].dtype == theirs[k].dtype and np.array_equal(ours[k], theirs[k]) for k in theirs)
    _, back, _ = read_hf_config(out)
    _, original, _ = read_hf_config(folder)
    built = [DeepseekV3Config.from_model_config(dict(mc, seq_length=16)) for mc in (back, original)]
    assert built[0] == built[1]


BASE = dict(num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, seq_length=8, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_experts=4, num_experts_per_tok=2,
            first_k_dense_replace=1, moe_intermediate_size=8)


@pytest.mark.parametrize("change, parallel, named", [
    (dict(kv_lora_rank=None), {}, "kv_lora_rank"),
    ({}, {"model_parallel": 3}, "num_attention_heads"),
    (dict(qk_rope_head_dim=7), {}, "qk_rope_head_dim"),
])
def test_bad_sizes_are_named_before_anything_is_built(change, parallel, named):
    with pytest.raises(ValueError, match=named):
        DeepseekV3Config.from_model_config(dict(BASE, **change), parallel)


def test_sequence_parallel_is_accepted_with_mla():
    """tp2 + sequence parallel builds (proven = one process in tests/test_deepseek_v3_msrun.py)."""
    config = DeepseekV3Config.from_model_config(BASE, {"model_parallel": 2, "use_seq_parallel": True})
    assert config.sequence_parallel and config.tensor_model_parallel_size == 2


def test_bad_sizes_through_the_trainer_exit_2_before_any_process_group(tmp_path, capsys):
    """run_mindformer with the fixture folder and 3-way tensor parallelism of 4 heads: exit 2 naming the heads
    and the file they come from, with no worker started (--check_config runs in the launching process)."""
    import run_mindformer
    from tests.test_deepseek_v3_msrun import hf_yaml
    config = hf_yaml(str(tmp_path), os.path.join(DATA, "deepseek_v3"))
    code = run_mindformer.main(["--config", config, "--output_dir", str(tmp_path / "out"), "--check_config",
                                "--use_parallel", "True", "--worker_num", "3", "--parallel_config.model_parallel", "3",
                                "--parallel_config.data_parallel", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "deepseek_v3/config.json: num_heads" in err and "model_parallel = 3" in err, err


def test_select_recompute_of_the_up_projections_keeps_loss_and_gradients():
    """MLA's up-projections (q and kv) as select-recompute units (PyNative): the report names them in every
    layer, and the loss and every gradient equal the plain model's bitwise."""
    from mindformers_core.recompute import RecomputeConfig, apply_recompute
    ref = reference("deepseek_v3")
    ids = ms.Tensor(ref["input_ids"].astype(np.int32))
    out = []
    for select in (None, ["layers.*.self_attention.linear_q_up_proj", "layers.*.self_attention.linear_kv_up_proj"]):
        model = from_pretrained(os.path.join(DATA, "deepseek_v3"), seq_length=16)
        model.set_train(True)
        if select:
            report = apply_recompute(model, RecomputeConfig(mode="select", select=select))
            assert sorted(u.name for u in report.units) == sorted(
                f"decoder.layers.{i}.self_attention.{p}" for i in range(3) for p in ("linear_q_up_proj",
                                                                                   "linear_kv_up_proj"))
        loss, grads = ms.value_and_grad(model, None, model.trainable_params())(ids, ids)
        out.append((float(loss.asnumpy()), [g.asnumpy() for g in grads]))
    assert out[0][0] == out[1][0] and np.isfinite(out[0][0])
    assert all(np.array_equal(a, b) for a, b in zip(out[0][1], out[1][1]))


def test_positions_as_inputs_rotate_as_the_constant_tables_with_yarn_and_interleaving():
    """PositionRotary (packed documents, the KV cache's rotary) with the YaRN folder's config: positions 0..s-1
    given as inputs give exactly the constant tables' rotation; other positions give another one."""
    from mindformers_core.transformer.rotary import PositionRotary, RotaryEmbedding
    config = model_of("deepseek_v3_yarn").config
    kind = config.rotary_scaling.get("rope_type", config.rotary_scaling.get("type"))
    assert config.rotary_interleaved and kind == "yarn"
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 16, 4, 8)).astype(np.float32))
    pos = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    table = RotaryEmbedding(config, 8)(x).asnumpy()
    by_position = PositionRotary(config, 8)
    assert np.array_equal(by_position(x, ms.Tensor(pos)).asnumpy(), table)
    assert np.abs(by_position(x, ms.Tensor(pos[:, ::-1].copy())).asnumpy() - table).max() > 1e-2
