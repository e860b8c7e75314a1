"""Check by hand that our MindFormers export loads in MindFormers' own legacy Llama with equal logits (never in the
suite: the second half needs mindformers, see scripts/make_mindformers_fixtures.py for its venv).

    # 1. ours (the package's venv): the Llama fixture of tests/data/hf/llama loaded, its weights moved by a seeded
    #    random step (not the folder's any more), written in MindFormers' legacy names (split and fused), with our
    #    logits
    PYTHONPATH=. .venv/bin/python scripts/check_mindformers_export.py make OUT_DIR
    # 2. MindFormers 2.1.0 (its venv): its legacy LlamaForCausalLM (and the qkv_concat / ffn_concat one) built with
    #    the same sizes, the exported .ckpt loaded with load_param_into_net (strict: every parameter, no extra), its
    #    logits compared with ours
    LOCAL_DEFAULT_PATH=/tmp/mfout /work/mfvenv/bin/python scripts/check_mindformers_export.py check OUT_DIR

Exit status 1 when a relative difference (to the largest logit) exceeds 1e-5 or a parameter is not loaded.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(hidden_size=64, num_layers=2, num_heads=4, n_kv_heads=2, intermediate_size=128, vocab_size=320)


def make(out):
    import mindspore as ms
    from mindformers_core.models.hf.pretrained import from_pretrained
    from mindformers_core.models.mindformers.export import write_checkpoint
    from mindformers_core.models.mindformers.names import adapter_for
    model = from_pretrained(os.path.join(ROOT, "tests", "data", "hf", "llama"), seq_length=16)
    rng = np.random.default_rng(5)
    for p in model.trainable_params():
        value = p.asnumpy()
        p.set_data(ms.Tensor((value + rng.normal(0, 0.02, value.shape)).astype(value.dtype)))
    state = {p.name: p.asnumpy() for p in model.trainable_params()}
    os.makedirs(out, exist_ok=True)
    for name, keys in (("split", {}), ("concat", {"qkv_concat": True})):
        adapter = adapter_for("llama", model.config, scheme="legacy", model_config=keys)
        write_checkpoint(os.path.join(out, f"ours_{name}.ckpt"), state, adapter, overwrite=True)
    ids = rng.integers(3, 320, (2, 16)).astype(np.int32)
    logits = model(ms.Tensor(ids)).asnumpy()
    np.savez(os.path.join(out, "ours.npz"), input_ids=ids, logits=logits)
    print(f"wrote {out}: ours_split.ckpt, ours_concat.ckpt, ours.npz (logits {logits.shape})")


def check(out):
    import mindspore as ms
    from mindformers import build_context
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    build_context({"use_legacy": True, "context": {"mode": "GRAPH_MODE", "device_target": "CPU"}, "parallel": {}})
    ref = np.load(os.path.join(out, "ours.npz"))
    ids, want = ref["input_ids"], ref["logits"]
    worst = 0.0
    for name, concat in (("split", False), ("concat", True)):
        cfg = LlamaConfig(batch_size=ids.shape[0], seq_length=ids.shape[1], use_past=False, use_flash_attention=False,
                          use_rope_slice=True, compute_dtype="float32", layernorm_compute_type="float32",
                          softmax_compute_type="float32", rotary_dtype="float32", param_init_type="float32",
                          qkv_concat=concat, ffn_concat=concat, fused_rms_norm=False, rms_norm_eps=1e-6,
                          theta=10000.0, **SIZES)
        model = LlamaForCausalLM(cfg)
        params = ms.load_checkpoint(os.path.join(out, f"ours_{name}.ckpt"))
        not_loaded, unused = ms.load_param_into_net(model, params, strict_load=True)
        model.set_train(False)
        logits = model(ms.Tensor(ids))[0].asnumpy().reshape(want.shape)
        diff = float(np.abs(logits - want).max() / np.abs(want).max())
        same = bool((logits.argmax(-1) == want.argmax(-1)).all())
        print(f"MindFormers legacy Llama ({name}): {len(params)} tensors, not loaded {not_loaded}, unused {unused}, "
              f"logits max rel diff {diff:.3g}, every argmax equal: {same}")
        worst = max(worst, diff if not not_loaded and not unused else 1.0)
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__)
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2]))
