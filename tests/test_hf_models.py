"""Each registered Hugging Face family against ``transformers`` itself: the tiny random models that
``scripts/make_hf_fixtures.py`` saved with transformers 5.24 (tests/data/hf/, with their reference logits),
built from their config.json, loaded from their safetensors and run here in PyNative and under ms.jit.
Logits agree to 1e-5 of their largest magnitude (fp32); the sharded folder gives the same as the single
file; the bf16 folder equals the fp32 logits of its bf16-rounded weights. No torch, no transformers here."""
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models.hf.config import read_hf_config
from mindformers_core.models.hf.pretrained import from_pretrained

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_moe_sharded": "Qwen3MoeForCausalLM",
            "llama_bf16": "LlamaForCausalLM"}


def reference(name):
    return np.load(os.path.join(DATA, name, "reference.npz"))


def logits(model, ids, mode):
    x = ms.Tensor(ids.astype(np.int32))
    if mode == "jit":
        def forward(t):
            return model(t)
        return ms.jit(forward)(x).asnumpy()
    return model(x).asnumpy()


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_equal_transformers(name, mode):
    ref = reference(name)
    spec, _, _ = read_hf_config(os.path.join(DATA, name))
    assert spec.name == FAMILIES[name]
    model = from_pretrained(os.path.join(DATA, name), seq_length=ref["input_ids"].shape[1])
    got = logits(model, ref["input_ids"], mode)
    want = ref["logits"]
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-5, f"{name} {mode}: max |ours - transformers| / max |transformers| = {err:.2e}"


def test_the_check_can_fail_a_wrong_layer_order_is_seen():
    """Swapping two layers' weights (a wrong layer-index mapping) moves the logits far beyond the tolerance."""
    ref = reference("qwen3")
    model = from_pretrained(os.path.join(DATA, "qwen3"), seq_length=16)
    params = {p.name: p for p in model.trainable_params()}
    a, b = "decoder.layers.0.self_attention.linear_q.weight", "decoder.layers.1.self_attention.linear_q.weight"
    va, vb = params[a].asnumpy(), params[b].asnumpy()
    params[a].set_data(ms.Tensor(vb))
    params[b].set_data(ms.Tensor(va))
    got = logits(model, ref["input_ids"], "pynative")
    assert np.abs(got - ref["logits"]).max() / np.abs(ref["logits"]).max() > 1e-2


def test_sharded_folder_equals_single_file_bitwise():
    a = from_pretrained(os.path.join(DATA, "qwen3_moe"), seq_length=16)
    b = from_pretrained(os.path.join(DATA, "qwen3_moe_sharded"), seq_length=16)
    pa, pb = dict(a.parameters_and_names()), dict(b.parameters_and_names())
    assert sorted(pa) == sorted(pb)
    assert all(np.array_equal(pa[n].asnumpy(), pb[n].asnumpy()) for n in pa)


def test_bf16_folder_is_within_bf16_of_the_fp32_one():
    fp32 = from_pretrained(os.path.join(DATA, "llama"), seq_length=16)
    bf16 = from_pretrained(os.path.join(DATA, "llama_bf16"), seq_length=16)
    for (name, p), (_, q) in zip(fp32.parameters_and_names(), bf16.parameters_and_names()):
        assert q.dtype == ms.float32, name                 # loaded into the model's float32 parameters
        np.testing.assert_allclose(q.asnumpy(), p.asnumpy(), rtol=2 ** -8, atol=1e-6)
