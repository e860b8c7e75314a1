"""Generation with the static KV cache (mindformers_core/generation, transformer/kv_cache.py).

- Greedy ids = transformers 5.24's ``generate(do_sample=False, max_new_tokens=32)`` on its own tiny models
  (tests/data/hf: Llama, Qwen2 with EOS stops, Qwen3 with q/k norm, Qwen3-MoE), the three prompts of 5, 9
  and 12 tokens run as ONE left-padded batch, PyNative and jit; one prompt alone too.
- The cache is right: every decode step's logits = a full forward over the same prefix (1e-5).
- Sampling follows Hugging Face's definitions: the chooser's processed scores = a NumPy transcription of
  transformers' repetition penalty, temperature, top-k and top-p processors on fixed logits; seeded sampling
  repeats and gives the same tokens in PyNative and jit.
- Bad input is named before anything runs.
"""
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.generation import GenerationConfig, Generator, TokenChooser
from mindformers_core.generation.sampling import uniform_noise
from mindformers_core.models.hf.config import read_hf_config
from mindformers_core.models.hf.pretrained import from_pretrained

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
_MODELS = {}


def fixture(name):
    if name not in _MODELS:
        folder = os.path.join(DATA, name)
        _, model_config, generation = read_hf_config(folder)
        _MODELS[name] = (from_pretrained(folder, seq_length=16), generation, model_config,
                         np.load(os.path.join(folder, "reference.npz")))
    return _MODELS[name]


def prompts_of(ref):
    return [[int(t) for t in ref[f"prompt_{i}"]] for i in range(3)]


# Qwen3 under jit is docs/generation.md's example (tests/test_docs.py runs it: two prompts as one batch, the ids
# against transformers'), so it is not compiled a second time here
# each family in one mode at least and both modes on llama and qwen3_moe (qwen2 = llama's decoder with q/k/v biases:
# jit; qwen3: PyNative)
FAMILIES = [(name, mode) for name in ("llama", "qwen2", "qwen3", "qwen3_moe") for mode in ("pynative", "jit")
            if (name, mode) not in (("qwen3", "jit"), ("qwen2", "pynative"))]
# DeepSeek-V3 (multi-latent attention's compressed cache, noaux_tc experts), the YaRN folder (its scaled tables in
# the cache's rotary rows and softmax scale): jit only (PyNative decodes the MoE model op by op, ~40 s); the plain
# folder is decoded at tp2 by tests/test_generation_msrun.py
DEEPSEEK = [("deepseek_v3_yarn", "jit")]


@pytest.mark.parametrize("name, mode", FAMILIES + DEEPSEEK)
def test_greedy_batch_equals_transformers(name, mode):
    model, generation, model_config, ref = fixture(name)
    config = GenerationConfig.from_dict(generation, {"max_new_tokens": 32})
    gen = Generator(model, config, jit=mode == "jit", max_positions=model_config["max_position_embeddings"])
    results, stats = gen.generate(prompts_of(ref))
    for i, r in enumerate(results):
        want = [int(t) for t in ref[f"generated_{i}"]]
        assert r.token_ids == want, f"{name} {mode} prompt {i}"
        assert r.finish_reason == ("eos" if want[-1] == 2 else "length")
    assert stats.prefill_tokens == 26 and stats.decode_steps >= 1
    assert not [p for p in model.get_parameters() if "kv_cache" in p.name]       # detached afterwards


def test_one_prompt_alone_stops_at_eos():
    model, generation, _, ref = fixture("qwen2")
    results, _ = Generator(model, GenerationConfig.from_dict(generation, {"max_new_tokens": 32})).generate(
        [prompts_of(ref)[0]])
    assert results[0].token_ids == [int(t) for t in ref["generated_0"]] and results[0].new_ids[-1] == 2


def test_decode_loop_in_chunks_and_step_by_step_give_the_same_tokens():
    """The greedy decode loop in chunks of 5 steps (as a streamer gets them) and one step per token give
    transformers' ids, streamed token by token; Qwen2's prompts 0 and 2 stop at EOS inside the first chunk, and
    alone the loop ends there (PyNative: the chunking is the host's; the jit loop is
    test_greedy_batch_equals_transformers')."""
    model, generation, model_config, ref = fixture("qwen2")
    prompts = prompts_of(ref)
    gen = Generator(model, GenerationConfig.from_dict(generation, {"max_new_tokens": 12}),
                    max_positions=model_config["max_position_embeddings"])
    want = [[int(t) for t in ref[f"generated_{i}"]][:len(prompts[i]) + 12] for i in range(3)]
    for chunk, loop in ((5, True), (None, False)):
        gen.loop_chunk, gen.decode_loop = chunk, loop
        streamed = []
        results, stats = gen.generate(prompts, streamer=lambda t, tokens, active: streamed.append(t))
        assert [r.token_ids for r in results] == want, f"loop_chunk {chunk}, decode_loop {loop}"
        assert streamed == list(range(12)) and stats.decode_steps == 11 == len(stats.step_seconds)
    gen.loop_chunk, gen.decode_loop = 5, True
    results, stats = gen.generate([prompts[0], prompts[2]])
    assert [r.token_ids for r in results] == [want[0], want[2]] and [r.finish_reason for r in results] == ["eos"] * 2
    assert stats.decode_steps == 4              # 5 tokens: the prefill's and 4 steps; the loop stopped early


def full_logits(model, ids):
    """Logits (n, vocab) of one row by the ordinary forward (positions 0..n-1 as inputs, no cache)."""
    x = ms.Tensor(np.asarray(ids, np.int32)[None])
    pos = ms.Tensor(np.arange(len(ids), dtype=np.int32)[None])
    return model(x, None, None, pos).asnumpy()[0]


@pytest.mark.parametrize("name,mode", [("qwen3_moe", "pynative"), ("llama", "jit")])
def test_every_decode_step_equals_a_full_forward(name, mode):
    model, generation, _, ref = fixture(name)
    prompts = prompts_of(ref)
    # one step per token (decode_loop=False): each step's logits come back through run_step
    gen = Generator(model, GenerationConfig(max_new_tokens=6, eos_token_id=[]), jit=mode == "jit", decode_loop=False)
    results, _ = gen.generate(prompts)
    # replay with the prefill logits and each decode step's logits recorded
    steps = []
    original = gen.run_step

    def recording(*args):
        out = original(*args)
        steps.append(out.asnumpy()[:, -1, :])
        return out
    gen.run_step = recording
    again, _ = gen.generate(prompts)
    assert [r.new_ids for r in again] == [r.new_ids for r in results]
    assert len(steps) == 6          # the prefill + 5 decode steps (the 6th token needs no further step)
    plain = from_pretrained(os.path.join(DATA, name), seq_length=32)       # tables for the longest prefix
    for i, r in enumerate(results):
        seq = r.token_ids
        n = len(prompts[i])
        want = full_logits(plain, seq[:n + 5])                       # (n + 5, vocab)
        for t, got in enumerate(steps):
            ref_row = want[n - 1 + t]
            err = np.abs(got[i] - ref_row).max() / np.abs(ref_row).max()
            assert err <= 1e-5, f"{name} {mode} row {i} step {t}: {err:.2e}"


# --------------------------------------------------------------------------------------------- sampling
def hf_process(scores, input_ids, penalty, temperature, top_k, top_p, do_sample=True):
    """transformers' processors, transcribed to NumPy (RepetitionPenalty, Temperature, TopK, TopP)."""
    scores = scores.astype(np.float32).copy()
    if penalty != 1.0:
        for b, ids in enumerate(input_ids):
            score = scores[b, ids]
            score = np.where(score < 0, score * penalty, score / penalty)
            scores[b, ids] = score
    if not do_sample:
        return scores
    if temperature != 1.0:
        scores = scores / np.float32(temperature)
    if top_k:
        k = min(top_k, scores.shape[-1])
        kth = -np.sort(-scores, axis=-1)[:, k - 1:k]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")
        sorted_logits = np.take_along_axis(scores, order, -1)
        e = np.exp(sorted_logits - sorted_logits.max(-1, keepdims=True))
        cumulative = np.cumsum(e / e.sum(-1, keepdims=True), -1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = np.zeros_like(remove_sorted)
        np.put_along_axis(remove, order, remove_sorted, -1)
        scores = np.where(remove, -np.inf, scores)
    return scores


CASES = [dict(penalty=1.3, temperature=0.7, top_k=7, top_p=0.8), dict(penalty=1.0, temperature=1.0, top_k=0, top_p=0.5),
         dict(penalty=0.8, temperature=1.5, top_k=50, top_p=1.0), dict(penalty=2.0, temperature=1.0, top_k=3, top_p=0.95)]


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_processors_equal_hf_definitions(case, mode):
    c = CASES[case]
    rng = np.random.default_rng(case)
    logits = (rng.standard_normal((4, 40)) * 3).astype(np.float32)
    input_ids = [rng.choice(40, size=6, replace=False) for _ in range(4)]
    presence = np.zeros((4, 40), np.float32)
    for b, ids in enumerate(input_ids):
        presence[b, ids] = 1
    config = GenerationConfig(do_sample=True, repetition_penalty=c["penalty"], temperature=c["temperature"],
                              top_k=c["top_k"], top_p=c["top_p"])
    chooser = TokenChooser(config, 40)
    noise = uniform_noise(np.random.default_rng(7), (4, 40))
    args = [ms.Tensor(a) for a in (logits, presence, np.zeros_like(presence), noise)]
    fn = ms.jit(chooser.construct) if mode == "jit" else chooser
    tokens, scores = fn(*args)
    want = hf_process(logits, input_ids, **c)
    got = scores.asnumpy()
    assert np.array_equal(np.isinf(got), np.isinf(want)), "a different set of tokens was filtered"
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    assert 1 <= finite.sum(-1).min()
    np.testing.assert_array_equal(tokens.asnumpy(), np.argmax(want - np.log(-np.log(noise)), -1))
    greedy = TokenChooser(GenerationConfig(repetition_penalty=c["penalty"]), 40)
    g_tokens, g_scores = greedy(*args)
    np.testing.assert_allclose(g_scores.asnumpy(), hf_process(logits, input_ids, c["penalty"], 1, 0, 1, False), rtol=1e-6)
    np.testing.assert_array_equal(g_tokens.asnumpy(), np.argmax(hf_process(logits, input_ids, c["penalty"], 1, 0, 1,
                                                                            False), -1))


def test_gumbel_draws_follow_softmax():
    """Frequencies of the Gumbel-max draws match softmax(scores) (the multinomial's distribution)."""
    logits = np.array([[2.0, 1.0, 0.0, -1.0, -np.inf]], np.float32)
    rng = np.random.default_rng(0)
    u = uniform_noise(rng, (20000, 5))
    draws = np.argmax(logits - np.log(-np.log(u)), -1)
    p = np.exp(logits[0] - logits[0][np.isfinite(logits[0])].max())
    p /= p.sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=5) / 20000, p, atol=0.01)


def test_seeded_sampling_repeats_and_pynative_equals_jit():
    model, generation, _, ref = fixture("llama")
    config = GenerationConfig.from_dict(generation, dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
                                                         repetition_penalty=1.2, max_new_tokens=8, seed=11))
    prompts = prompts_of(ref)
    a, _ = Generator(model, config).generate(prompts)
    b, _ = Generator(model, config, loop_chunk=3).generate(prompts)            # the decode loop in 3 calls
    c, _ = Generator(model, config, jit=True).generate(prompts)
    d, _ = Generator(model, config.replace(seed=12)).generate(prompts)
    e, _ = Generator(model, config, decode_loop=False).generate(prompts)       # the chooser on the host side
    assert [r.new_ids for r in a] == [r.new_ids for r in b] == [r.new_ids for r in c] == [r.new_ids for r in e]
    assert [r.new_ids for r in a] != [r.new_ids for r in d]
    greedy = [[int(t) for t in ref[f"generated_{i}"]][len(p):len(p) + 8] for i, p in enumerate(prompts)]
    assert [r.new_ids for r in a] != greedy


def test_min_new_tokens_and_several_eos_ids():
    model, generation, _, ref = fixture("qwen2")
    prompts = prompts_of(ref)
    base = GenerationConfig.from_dict(generation, {"max_new_tokens": 12})
    held, _ = Generator(model, base.replace(min_new_tokens=8)).generate([prompts[0]])
    assert 2 not in held[0].new_ids[:8]
    alone = [int(t) for t in ref["generated_1"]][len(prompts[1]):]
    stop = alone[3]               # the 4th new token of prompt 1 as a second EOS id
    first = alone.index(stop)
    two, _ = Generator(model, base.replace(eos_token_id=[2, stop])).generate([prompts[1]])
    assert two[0].new_ids == alone[:first + 1] and two[0].finish_reason == "eos"


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("key,value", [("top_p", 0.0), ("top_p", 1.5), ("temperature", 0.0), ("top_k", -1),
                                       ("repetition_penalty", 0), ("max_new_tokens", 0)])
def test_bad_generation_values_are_named(key, value):
    with pytest.raises(ValueError, match=key):
        GenerationConfig.from_dict({key: value})


def test_prompt_longer_than_the_model_is_named_before_running():
    model, generation, model_config, _ = fixture("llama")
    gen = Generator(model, GenerationConfig(max_new_tokens=4), max_positions=model_config["max_position_embeddings"])
    with pytest.raises(ValueError, match="prompt 1 has 70 tokens, more than the model's maximum 64"):
        gen.generate([[5] * 3, [5] * 70])
    assert not [p for p in model.get_parameters() if "kv_cache" in p.name]


@pytest.mark.parametrize("key", ["pipeline_model_parallel_size", "expert_model_parallel_size", "data_parallel_size"])
def test_parallel_generation_names_what_it_does_not_run(key):
    import dataclasses
    model, _, _, _ = fixture("qwen3_moe")
    config = dataclasses.replace(model.config, tensor_model_parallel_size=2)
    object.__setattr__(config, key, 2)
    with pytest.raises(ValueError, match=f"{key} = 2 is not supported"):
        Generator(model, GenerationConfig(), parallel_config=config)
