"""Make the Hugging Face reference fixtures in tests/data/hf/ (run once, by hand, outside the test suite).

Tiny random causal LMs built with the real ``transformers`` classes (seeded, fp32), saved with
``save_pretrained`` (safetensors) together with a tiny byte-level BPE tokenizer, a ``generation_config.json``
and ``reference.npz`` (logits, greedy generations, one encoded sentence) computed by ``transformers`` from
the saved folder itself. The test suite reads these files only: it never imports torch or transformers.

Made with (Python 3.11, a throwaway venv; the package's own venv never gets torch or transformers):

    python3.11 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \\
        transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py            # writes tests/data/hf/<name>/

Versions used for the stored fixtures: torch 2.13.0+cpu, transformers 5.24.0, tokenizers 0.23.3,
safetensors 0.8.0, numpy 2.4.6, CPython 3.11. Seed 11 (torch, and numpy for the input ids).

Check an exported folder (ours, written in Hugging Face format) against a stored reference:

    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py --check-export out/hf_export --reference qwen3

loads it with ``transformers.AutoModelForCausalLM.from_pretrained(DIR, dtype=float32)`` and prints the max
abs/rel difference of its logits on the stored input ids against ``tests/data/hf/NAME/reference.npz`` (and
whether its greedy generations equal the stored ones). Exit status 1 when the logits differ by more than
``--tol`` (relative to the largest reference logit).
"""
import argparse
import inspect
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "hf")
SEED = 11
VOCAB = 320                     # 3 special tokens + 256 byte symbols + 61 merges
PAD, BOS, EOS = "<pad>", "<s>", "</s>"        # ids 0, 1, 2
MAX_POS = 64
BATCH, SEQ = 2, 16              # reference logits: input_ids (2, 16)
PROMPT_LENGTHS = (5, 9, 12)     # greedy generation prompts (each run alone, no padding)
MAX_NEW_TOKENS = 32
SENTENCE = "Return a new list containing all items from the iterable in ascending order. Ünïcödé ok?"
# tokenizer training text: the docstrings of these standard-library modules (CPython 3.11), in this order
TEXT_MODULES = ("bisect", "heapq", "json", "string", "textwrap", "functools", "collections", "itertools")
# a simple chat template over the bos/eos tokens (no extra special tokens): the fine-tuning issue uses it
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")

COMMON = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POS, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, rms_norm_eps=1e-6, initializer_range=0.2)
DEEPSEEK_V3 = dict(
    hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
EXPERT_BIAS = 0.2               # DeepSeek-V3 fixtures: e_score_correction_bias ~ N(0, 0.2) (seeded), not zeros
# name -> (transformers class name, config class name, config keywords)
MODELS = {
    # GQA (4 query heads, 2 kv heads), untied head, rope_theta 10000
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # q/k/v biases (o without), TIED embeddings (the one tied family), rope_theta 1e6
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # q/k RMSNorm per head, decoupled head_dim 16 != 32/4, untied, rope_theta 500000
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # 8 experts, top-2, normalised top-k; layer 0 dense (mlp_only_layers), layers 1-2 MoE; head_dim 16
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[0], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # DeepSeek-V3: multi-latent attention (q low rank 48, kv low rank 32, qk 16 + rope 8, v 16, interleaved
    # rope), layer 0 dense, layers 1-2 MoE: 8 routed experts top-2 in 2 groups (best 1 group), sigmoid scores,
    # noaux_tc expert bias (set nonzero after init, see EXPERT_BIAS), routed_scaling_factor 2.5, 1 shared expert
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(DEEPSEEK_V3)),
    # the same weights with YaRN on (factor 4 over 16 original positions, mscale != mscale_all_dim)
    "deepseek_v3_yarn": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(DEEPSEEK_V3, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707})),
    # DeepSeek-V2-Lite's plain q projection (q_lora_rank None)
    "deepseek_v3_q_full": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(DEEPSEEK_V3, q_lora_rank=None)),
}
# variants: name -> (source model, how it is saved)
VARIANTS = {"qwen3_moe_sharded": ("qwen3_moe", dict(max_shard_size="100KB")),
            "llama_bf16": ("llama", dict(dtype="bfloat16"))}
REFERENCE_KEYS = ("input_ids", "logits", "prompt_0", "prompt_1", "prompt_2", "generated_0", "generated_1",
                  "generated_2", "sentence", "sentence_ids", "sentence_ids_with_special")


def training_text():
    """Docstrings of TEXT_MODULES (module, then its public classes/functions by name), one per line."""
    import importlib
    lines = []
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        docs = [module.__doc__]
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isroutine(obj)):
                docs.append(obj.__doc__)
        lines += [" ".join(d.split()) for d in docs if isinstance(d, str) and d.strip()]
    return lines


def make_tokenizer():
    """A byte-level BPE (VOCAB entries: <pad>, <s>, </s>, 256 byte symbols, merges) wrapped in
    PreTrainedTokenizerFast; the post-processor prepends <s> (Llama style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[PAD, BOS, EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert [tok.token_to_id(t) for t in (PAD, BOS, EOS)] == [0, 1, 2]
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   chat_template=CHAT_TEMPLATE, model_max_length=MAX_POS)


def build_model(name):
    import torch
    import transformers
    cls_name, cfg_name, kw = MODELS[name]
    torch.manual_seed(SEED)
    config = getattr(transformers, cfg_name)(**COMMON, **kw)
    model = getattr(transformers, cls_name)(config).to(torch.float32).eval()
    if cls_name == "DeepseekV3ForCausalLM":     # noaux_tc's expert bias: nonzero so that it changes choices
        gen = torch.Generator().manual_seed(SEED)
        for mod in model.modules():
            if type(mod).__name__ == "DeepseekV3TopkRouter":
                mod.e_score_correction_bias.copy_(torch.randn(mod.num_experts, generator=gen) * EXPERT_BIAS)
    model.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                                            do_sample=False)
    return model


def load(folder, dtype="float32"):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()


def logits_of(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()


def generate(model, prompt):
    import torch
    x = torch.as_tensor(np.asarray(prompt)[None], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    return out[0].numpy().astype(np.int64)


def margins(model, ids, prompts):
    """Smallest gap between the best and second-best logit at the reference positions and at each greedy
    step of each prompt, and (MoE) between the k-th and (k+1)-th router logit of any token: a near tie
    would make greedy ids or expert choice fragile to float rounding."""
    def gap(logits, k=1):
        top = np.sort(logits, axis=-1)[..., -k - 1:]
        return round(float((top[..., 1] - top[..., 0]).min()), 5)
    def router_gap(mod, logits):
        if not hasattr(mod, "e_score_correction_bias"):
            return gap(logits, mod.top_k)
        # DeepSeek-V3: the choice is on sigmoid + bias, first among groups (sum of each group's best two),
        # then among the experts of the chosen groups
        choice = 1 / (1 + np.exp(-logits)) + mod.e_score_correction_bias.numpy()
        groups = np.sort(choice.reshape(len(choice), mod.num_group, -1), -1)[..., -2:].sum(-1)
        kept = np.argsort(-groups, -1)[:, :mod.topk_group]
        mask = np.zeros_like(groups, bool)
        np.put_along_axis(mask, kept, True, -1)
        masked = np.where(np.repeat(mask, mod.num_experts // mod.num_group, -1), choice, -np.inf)
        return min(gap(groups, mod.topk_group), gap(np.where(np.isinf(masked), -1e9, masked), mod.top_k))
    routers = [mod for mod in model.modules() if type(mod).__name__.lower().endswith("topkrouter")]
    seen = []
    hooks = [mod.register_forward_hook(lambda mod, args, out: seen.append(router_gap(mod, out[0].detach().numpy())))
             for mod in routers]
    steps = []
    try:
        reference = gap(logits_of(model, ids))
        for p in prompts:
            seq = generate(model, p)
            steps.append(gap(logits_of(model, seq[None, :-1])[0, len(p) - 1:]))
    finally:
        for h in hooks:
            h.remove()
    return dict(reference=reference, greedy=steps, **({"router": min(seen)} if seen else {}))


def expert_choices(model, ids):
    """DeepSeek-V3 only: ``experts_{layer}`` (tokens, top_k) int64, the routed experts each token of ``ids``
    chose in each MoE layer (sorted), and ``expert_weights_{layer}`` their weights (same order)."""
    import torch
    out, hooks = {}, []
    for name, mod in model.named_modules():
        if type(mod).__name__ == "DeepseekV3TopkRouter":
            layer = int(name.split(".")[2])

            def keep(mod, args, res, layer=layer):
                order = torch.argsort(res[2], -1)
                out[f"experts_{layer}"] = torch.gather(res[2], -1, order).numpy().astype(np.int64)
                out[f"expert_weights_{layer}"] = torch.gather(res[1], -1, order).detach().numpy().astype(np.float32)
            hooks.append(mod.register_forward_hook(keep))
    try:
        if hooks:
            logits_of(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return out


def references(folder, tokenizer):
    """reference.npz of a saved folder: computed by transformers from the files on disk (fp32 compute)."""
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    encoded = tokenizer(SENTENCE, add_special_tokens=False)["input_ids"]
    prompts = [np.asarray(([1] + encoded)[:n], np.int64) for n in PROMPT_LENGTHS]
    model = load(folder)
    ref = {"input_ids": ids, "logits": logits_of(model, ids).astype(np.float32),
           "sentence": np.array(SENTENCE), "sentence_ids": np.asarray(encoded, np.int64),
           "sentence_ids_with_special": np.asarray(tokenizer(SENTENCE)["input_ids"], np.int64)}
    for i, p in enumerate(prompts):
        ref[f"prompt_{i}"], ref[f"generated_{i}"] = p, generate(model, p)
    ref.update(expert_choices(model, ids))
    np.savez_compressed(os.path.join(folder, "reference.npz"), **ref)
    return model, ref, prompts


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def make_all(out, only=None):
    import torch
    import transformers
    tokenizer = make_tokenizer()
    summary = {}
    for name in only or list(MODELS) + list(VARIANTS):
        folder = os.path.join(out, name)
        shutil.rmtree(folder, ignore_errors=True)
        source, save = VARIANTS.get(name, (name, {}))
        model = build_model(source)
        if save.get("dtype") == "bfloat16":
            model = model.to(torch.bfloat16)
        model.save_pretrained(folder, **{k: v for k, v in save.items() if k != "dtype"})
        tokenizer.save_pretrained(folder)
        reloaded, ref, prompts = references(folder, tokenizer)
        if name in MODELS:      # the saved files are the model: same logits as the one in memory
            assert np.array_equal(logits_of(build_model(name), ref["input_ids"]), ref["logits"]), name
        summary[name] = dict(bytes=folder_bytes(folder), files=sorted(os.listdir(folder)),
                             params=sum(p.numel() for p in reloaded.parameters()),
                             generated_new=[int(len(ref[f"generated_{i}"]) - len(prompts[i])) for i in range(3)],
                             min_top2_margin=margins(reloaded, ref["input_ids"], prompts))
    print(json.dumps(summary, indent=1))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"tokenizers {__import__('tokenizers').__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")


def check_export(folder, name, tol):
    """``name``: a fixture (its reference.npz), or the path of an .npz holding ``input_ids`` and OUR logits of
    the exported model (a model trained here: transformers must reproduce what we computed)."""
    ref = np.load(name if name.endswith(".npz") else os.path.join(OUT, name, "reference.npz"))
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        on_disk = json.load(f).get("dtype") or "?"
    model = load(folder)
    got = logits_of(model, ref["input_ids"])
    want = ref["logits"]
    diff = np.abs(got - want)
    abs_max, rel_max = float(diff.max()), float(diff.max() / np.abs(want).max())
    same_gen = [np.array_equal(generate(model, ref[f"prompt_{i}"]), ref[f"generated_{i}"]) for i in range(3)
                if f"prompt_{i}" in ref.files]
    print(f"{folder} (config dtype {on_disk}) vs {name}: logits {tuple(got.shape)} "
          f"max abs diff {abs_max:.3e}, max rel diff {rel_max:.3e} (of max |logit| {np.abs(want).max():.3f}); "
          f"argmax equal {bool((got.argmax(-1) == want.argmax(-1)).all())}; greedy generations equal {same_gen}")
    return 0 if rel_max <= tol else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=OUT, help="where the fixture folders are written (default tests/data/hf)")
    p.add_argument("--check-export", metavar="DIR", help="a Hugging Face folder to compare with a reference")
    p.add_argument("--reference", metavar="NAME", help=f"the fixture to compare with: {sorted(MODELS) + sorted(VARIANTS)}, "
                                                       "or an .npz of input_ids and our logits")
    p.add_argument("--only", nargs="+", metavar="NAME", help="make these fixtures only (default: all)")
    p.add_argument("--tol", type=float, default=1e-5, help="largest accepted relative logit difference")
    args = p.parse_args(argv)
    if args.check_export:
        if not args.reference:
            p.error("--check-export needs --reference NAME")
        return check_export(args.check_export, args.reference, args.tol)
    make_all(args.out, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
