"""Make the MindFormers checkpoint fixtures in tests/data/mindformers/ (run once, by hand, never in the suite).

MindFormers' own code writes every checkpoint here; the suite only reads the files (it never imports
mindformers). Run in a throwaway venv (never a dependency of the package or of the suite):

    python3.11 -m venv /work/mfvenv
    /work/mfvenv/bin/pip install --no-deps mindformers==2.1.0
    /work/mfvenv/bin/pip install mindspore==2.10.0 "numpy<2" "pandas<3" "pyarrow<22" sentencepiece ftfy regex \\
        tqdm pyyaml jieba rouge_chinese mindpet==1.0.4 opencv-python-headless tokenizers astunparse tiktoken \\
        jinja2 setproctitle safetensors tensorboardX deprecated pybind11 "transformers>=5.3" datasets
    /work/mfvenv/bin/pip install --no-deps /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /work/mfvenv/bin/pip install sympy networkx filelock fsspec typing_extensions     # (torch: qwen3_moe only)
    LOCAL_DEFAULT_PATH=/tmp/mfout /work/mfvenv/bin/python scripts/make_mindformers_fixtures.py  # [legacy|mcore|moe]

(mindformers 2.1.0's metadata asks for mindspore 2.11 and hyper-parallel, neither on the package index;
pyarrow >= 22 needs NumPy 2, which MindSpore 2.10 cannot use. ``import mindformers`` works with the above.)

What is made (each a folder under tests/data/mindformers/ with ``reference.npz``: ``input_ids`` and
``logits``):

- ``llama_legacy``: MindFormers' legacy ``LlamaForCausalLM`` (use_legacy, use_rope_slice, no flash attention,
  float32, CPU) built with a seeded random init, trained 2 AdamW steps on CPU in graph mode, saved with
  ``mindspore.save_checkpoint`` as ``llama.ckpt`` and as MindFormers' unified folder (``unified/``: the
  ``part*.safetensors`` files and ``param_name_map.json`` that ``mindspore.parallel.unified_safetensors``
  writes); the logits are MindFormers' own forward of the trained model.
- ``llama_legacy_concat``: the same trained weights in MindFormers' fused legacy layout (``qkv_concat`` /
  ``ffn_concat``: ``attention.w_qkv`` and ``feed_forward.w_gate_hidden``), converted by MindFormers'
  ``convert_qkv_concat_weight`` and checked by running MindFormers' fused model on them (same logits).
- ``qwen2_legacy``: the legacy Llama with q/k/v biases (``qkv_has_bias``: MindFormers' legacy Qwen2), trained
  2 steps, ``.safetensors`` single file.
- ``qwen3``: MindFormers' mcore ``TrainingQwen3ForCausalLM`` built from the config.json of our transformers-made
  fixture tests/data/hf/qwen3, filled by MindFormers' own Hugging Face loader
  (``mindformers.checkpoint.checkpoint.load_hf_checkpoint``), saved with ``mindspore.save_checkpoint`` as
  ``.safetensors`` and ``.ckpt``. Its forward does not run on CPU: the logits are the fixture's transformers logits.
- ``qwen3_moe``: the same with ``TrainingQwen3MoeForCausalLM``, from a Qwen3-MoE that transformers makes here with
  every layer MoE (MindFormers 2.1.0's Qwen3-MoE reads neither ``mlp_only_layers`` nor ``first_k_dense_replace``,
  so our fixture's dense layer 0 does not fit it); its loader hands the experts over 3-D while the graph-mode
  parameter is 2-D (same bytes), so ``load_param_into_net`` is wrapped to reshape them (see
  ``_reshaping_load_param_into_net``). ``.ckpt``; logits: transformers'.
- ``deepseek_v3``: ``TrainingDeepseekV3ForCausalLM`` (no MTP layer) from tests/data/hf/deepseek_v3's config; 2.1.0
  has no Hugging Face template for it, so MindFormers' name table and conversion ops fill it
  (``make_deepseek_v3``). ``.safetensors``; logits: the fixture's transformers logits.

Each mcore folder keeps the Hugging Face ``config.json`` it was built from as ``config.hf.json``.

Versions used for the stored files: mindformers 2.1.0, mindspore 2.10.0, numpy 1.26.4, CPython 3.11.
"""
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "mindformers")
HF = os.path.join(ROOT, "tests", "data", "hf")
SEED = 7
VOCAB, SEQ, BATCH = 320, 16, 2
LEGACY = dict(hidden_size=64, num_layers=2, num_heads=4, n_kv_heads=2, intermediate_size=128, vocab_size=VOCAB,
              rms_norm_eps=1e-5, theta=10000.0)

os.environ.setdefault("LOCAL_DEFAULT_PATH", "/tmp/mfout")      # MindFormers' log folder, not the work tree

import mindspore as ms  # noqa: E402


def legacy_config(**over):
    from mindformers.models.llama import LlamaConfig
    kw = dict(batch_size=BATCH, seq_length=SEQ, use_past=False, use_flash_attention=False, use_rope_slice=True,
              compute_dtype="float32", layernorm_compute_type="float32", softmax_compute_type="float32",
              rotary_dtype="float32", param_init_type="float32", qkv_concat=False, ffn_concat=False,
              fused_rms_norm=False, **LEGACY)
    kw.update(over)
    return LlamaConfig(**kw)


def train_two_steps(model, seed):
    """Two AdamW steps of MindFormers' own loss (labels: the next token) on seeded random ids, graph mode."""
    from mindspore import nn
    rng = np.random.default_rng(seed)
    ids = [ms.Tensor(rng.integers(3, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)) for _ in range(2)]
    opt = nn.AdamWeightDecay(model.trainable_params(), learning_rate=5e-3, weight_decay=0.01)
    model.set_train(True)
    grad = ms.value_and_grad(model, None, opt.parameters)

    @ms.jit
    def step(x):
        loss, grads = grad(x)
        opt(grads)
        return loss
    losses = [float(step(x).asnumpy()) for x in ids]
    model.set_train(False)
    return losses


def logits_of(model, ids):
    model.set_train(False)
    out = model(ms.Tensor(ids))
    logits = out[0] if isinstance(out, tuple) else out
    return logits.asnumpy().reshape(ids.shape[0], ids.shape[1], -1).astype(np.float32)


def save_unified(params, folder, parts=2):
    """MindFormers' unified (merged) folder as ``mindspore.parallel.unified_safetensors`` writes it: the
    tensors in ``part{k}.safetensors`` and ``param_name_map.json`` ({"metadata", "weight_map": name -> file}).
    The source here is a one-rank checkpoint (nothing to merge), so the files are MindSpore's own save of
    the split parameter lists, and the map is written in the form MindSpore writes it."""
    os.makedirs(folder, exist_ok=True)
    names = [p.name for p in params]
    split = [names[k::parts] for k in range(parts)]
    weight_map, total = {}, 0
    for k, group in enumerate(split):
        chosen = [p for p in params if p.name in group]
        ms.save_checkpoint(chosen, os.path.join(folder, f"part{k}.safetensors"), format="safetensors")
        for p in chosen:
            weight_map[p.name] = f"part{k}.safetensors"
            total += p.asnumpy().nbytes
    with open(os.path.join(folder, "param_name_map.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=4))


def fresh(name):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def make_legacy():
    from mindformers import build_context
    from mindformers.models.llama import LlamaForCausalLM
    build_context({"use_legacy": True, "context": {"mode": "GRAPH_MODE", "device_target": "CPU"}, "parallel": {}})
    ms.set_seed(SEED)
    model = LlamaForCausalLM(legacy_config())
    losses = train_two_steps(model, SEED)
    ids = np.random.default_rng(SEED + 1).integers(3, VOCAB, (BATCH, SEQ)).astype(np.int32)
    logits = logits_of(model, ids)
    out = fresh("llama_legacy")
    params = list(model.get_parameters())
    ms.save_checkpoint(model, os.path.join(out, "llama.ckpt"))
    save_unified(params, os.path.join(out, "unified"))
    np.savez(os.path.join(out, "reference.npz"), input_ids=ids, logits=logits, losses=np.array(losses))
    print("llama_legacy: losses", losses, "logits", logits.shape, flush=True)

    # the fused legacy layout (qkv_concat / ffn_concat), converted by MindFormers' own function
    from mindformers.models.llama.convert_weight import convert_qkv_concat_weight
    from mindformers.tools import MindFormerConfig
    param_dict = {p.name: ms.Parameter(p.asnumpy(), name=p.name) for p in params}
    mcfg = MindFormerConfig(**{"model": {"model_config": dict(LEGACY, num_heads=4, n_kv_heads=2,
                                                              intermediate_size=128)}})
    fused = convert_qkv_concat_weight(param_dict, mcfg.model)
    concat = LlamaForCausalLM(legacy_config(qkv_concat=True, ffn_concat=True))
    not_loaded, _ = ms.load_param_into_net(concat, fused, strict_load=True)
    assert not not_loaded, not_loaded
    fused_logits = logits_of(concat, ids)
    diff = float(np.abs(fused_logits - logits).max() / np.abs(logits).max())
    print("llama_legacy_concat: MindFormers' fused model vs the split one, rel", diff, flush=True)
    assert diff < 1e-5
    out = fresh("llama_legacy_concat")
    ms.save_checkpoint(concat, os.path.join(out, "llama_concat.safetensors"), format="safetensors")
    np.savez(os.path.join(out, "reference.npz"), input_ids=ids, logits=fused_logits)

    # legacy Qwen2: the legacy Llama with q/k/v biases (MindFormers' research Qwen2 is this class)
    ms.set_seed(SEED + 2)
    qwen2 = LlamaForCausalLM(legacy_config(qkv_has_bias=True, rms_norm_eps=1e-6, theta=1000000.0))
    for p in qwen2.get_parameters():           # the biases start at zero: give them values to check
        if p.name.endswith(".bias"):
            p.set_data(ms.Tensor(np.random.default_rng(3).normal(0, 0.5, p.shape).astype(np.float32)))
    losses = train_two_steps(qwen2, SEED + 2)
    logits = logits_of(qwen2, ids)
    out = fresh("qwen2_legacy")
    ms.save_checkpoint(qwen2, os.path.join(out, "qwen2.safetensors"), format="safetensors")
    np.savez(os.path.join(out, "reference.npz"), input_ids=ids, logits=logits, losses=np.array(losses))
    print("qwen2_legacy: losses", losses, flush=True)


def hf_config(name):
    with open(os.path.join(HF, name, "config.json")) as f:
        cfg = json.load(f)
    for key in ("architectures", "transformers_version", "layer_types"):
        cfg.pop(key, None)
    return cfg


def _reshaping_load_param_into_net(load):
    """MindFormers 2.1.0's Hugging Face loader hands the routed experts over as 3-D (E, h, 2f) / (E, f, h)
    arrays, while its graph-mode GroupedMLP holds them as 2-D (E*h, 2f) / (E*f, h) parameters, and
    ``load_param_into_net`` refuses the shape (same elements, same order). This wrapper reshapes such an array
    to its parameter's shape (nothing else changes) so that MindFormers' own conversion can be saved."""
    def wrapped(net, parameter_dict, *args, **kwargs):
        params = net.parameters_dict()
        for key, value in list(parameter_dict.items()):
            target = params.get(key)
            if target is not None and tuple(value.shape) != tuple(target.shape) and value.size == target.size:
                print(f"  reshaped {key} {tuple(value.shape)} -> {tuple(target.shape)}", flush=True)
                parameter_dict[key] = ms.Parameter(ms.Tensor(value.asnumpy().reshape(target.shape)), name=key)
        out = load(net, parameter_dict, *args, **kwargs)
        print(f"  not loaded into the net: {out[0]}", flush=True)
        return out
    wrapped.reshaping = True
    return wrapped


def make_all_moe_folder(folder):
    """MindFormers 2.1.0's Qwen3-MoE makes every layer MoE (it reads neither mlp_only_layers nor
    first_k_dense_replace), so our qwen3_moe fixture (layer 0 dense) does not fit it: transformers makes the
    same model with every layer MoE (seed 11 as scripts/make_hf_fixtures.py), saved to ``folder`` with its logits
    on the stored input ids. Needs torch in this venv (pip install the CPU wheel)."""
    import torch
    import transformers
    with open(os.path.join(HF, "qwen3_moe", "config.json")) as f:
        base = json.load(f)
    keep = ("vocab_size", "max_position_embeddings", "pad_token_id", "bos_token_id", "eos_token_id", "rms_norm_eps",
            "initializer_range", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "moe_intermediate_size", "norm_topk_prob", "num_experts_per_tok",
            "tie_word_embeddings", "rope_parameters", "router_aux_loss_coef")
    kw = {k: base[k] for k in keep}
    torch.manual_seed(11)
    config = transformers.Qwen3MoeConfig(num_experts=base["num_local_experts"], decoder_sparse_step=1,
                                         mlp_only_layers=[], **kw)
    model = transformers.Qwen3MoeForCausalLM(config).eval().float()
    model.save_pretrained(folder)
    ids = np.load(os.path.join(HF, "qwen3_moe", "reference.npz"))["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor(ids.astype(np.int64))).logits.numpy()
    return ids, logits


def make_mcore(name, model_class, config_class, formats, source=None, reference=None, **over):
    import mindformers.checkpoint.checkpoint as mf_checkpoint
    if not getattr(mf_checkpoint.load_param_into_net, "reshaping", False):
        mf_checkpoint.load_param_into_net = _reshaping_load_param_into_net(mf_checkpoint.load_param_into_net)
    source = source or os.path.join(HF, name)
    with open(os.path.join(source, "config.json")) as f:
        cfg = json.load(f)
    for key in ("architectures", "transformers_version", "layer_types"):
        cfg.pop(key, None)
    model = model_class(config_class(**dict(cfg, **over)))
    mf_checkpoint.load_hf_checkpoint(source, model)
    out = fresh(name)
    for fmt in formats:
        ms.save_checkpoint(model, os.path.join(out, f"{name}.{fmt}"), format=fmt)
    if reference is None:
        ref = np.load(os.path.join(HF, name, "reference.npz"))
        reference = ref["input_ids"], ref["logits"]
    np.savez(os.path.join(out, "reference.npz"), input_ids=reference[0], logits=reference[1])
    shutil.copyfile(os.path.join(source, "config.json"), os.path.join(out, "config.hf.json"))
    for p in model.get_parameters():
        print(f"  {name}: {p.name} {tuple(p.shape)}", flush=True)


def make_deepseek_v3():
    """MindFormers 2.1.0's mcore ``TrainingDeepseekV3ForCausalLM`` (qk_layernorm, mla_qkv_concat and the interleaved
    MLP layout: its defaults for DeepSeek-V3; no MTP layer) built from our transformers-made fixture's config. 2.1.0
    registers no Hugging Face template for it (``load_hf_checkpoint`` refuses: "The template of current model is
    None"), so each parameter is filled from the fixture's tensors by MindFormers' own pieces: its name table
    (``convert_name``: the model's ``weight_mapping``) for the 1:1 tensors and its conversion ops
    (``checkpoint/converter/convert_op.py``) for the fused ones: ``ConcatConvertOp`` for ``linear_qkv`` (q_a_proj,
    kv_a_proj_with_mqa; not interleaved) and for ``linear_fc1`` / ``shared_experts.linear_fc1`` (gate, up; the
    layout from the config by its ``set_model_config``), ``ExpertsConvertOp`` for the stacked routed experts."""
    from mindformers.checkpoint.converter.convert_op import ConcatConvertOp, ExpertsConvertOp
    from mindformers.models.deepseek3.configuration_deepseek_v3 import DeepseekV3Config
    from mindformers.models.deepseek3.modeling_deepseek_v3_train import TrainingDeepseekV3ForCausalLM
    from safetensors.numpy import load_file
    name = "deepseek_v3"
    source = os.path.join(HF, name)
    with open(os.path.join(source, "config.json")) as f:
        cfg = json.load(f)
    for key in ("architectures", "transformers_version", "qk_head_dim", "head_dim", "rope_parameters", "dtype",
                "pretraining_tp", "output_router_logits", "rope_interleave"):
        cfg.pop(key, None)
    cfg.update(rope_theta=10000.0, moe_grouped_gemm=True, num_nextn_predict_layers=0, qk_layernorm=True)
    model = TrainingDeepseekV3ForCausalLM(DeepseekV3Config(**cfg))
    tc = model.get_gpt_transformer_config()
    hf = {k: v for k, v in load_file(os.path.join(source, "model.safetensors")).items()
          if not k.startswith(f"model.layers.{cfg['num_hidden_layers']}.")}          # the MTP layer: not built
    values = {}
    # MindFormers' weight_mapping names the Megatron split (mla_qkv_concat False); its concatenated module holds
    # linear_q_up_proj as linear_qb, linear_kv_up_proj as linear_kvb and the kv latent's norm as k_layernorm
    # (multi_latent_attention.py, MLASelfAttentionConcatenated)
    concat_names = {".self_attention.linear_q_up_proj.": ".self_attention.linear_qb.",
                    ".self_attention.linear_kv_up_proj.": ".self_attention.linear_kvb.",
                    ".self_attention.kv_layernorm.": ".self_attention.k_layernorm."}
    for k, v in hf.items():                   # the 1:1 tensors through MindFormers' own name table
        mf_name = model.convert_name(k)
        for a, b in concat_names.items():
            mf_name = mf_name.replace(a, b)
        values[mf_name] = v
    ops = []
    for i in range(cfg["num_hidden_layers"]):
        p, q = f"model.layers.{i}.", f"decoder.layers.{i}."
        ops.append(ConcatConvertOp([p + "self_attn.q_a_proj.weight", p + "self_attn.kv_a_proj_with_mqa.weight"],
                                   [q + "self_attention.linear_qkv.weight"], dim=0, interleaved=False))
        for mlp in ("mlp", "mlp.shared_experts"):
            if p + mlp + ".gate_proj.weight" in hf:
                op = ConcatConvertOp([p + mlp + ".gate_proj.weight", p + mlp + ".up_proj.weight"],
                                     [q + mlp + ".linear_fc1.weight"], dim=0)
                op.set_model_config(tc)
                ops.append(op)
        if p + "mlp.experts.0.gate_proj.weight" in hf:
            n = cfg["n_routed_experts"]
            for hf_names, mf in (((".gate_proj.weight", ".up_proj.weight"), "weight1"), ((".down_proj.weight",), "weight2")):
                op = ExpertsConvertOp([p + "mlp.experts.{}" + h for h in hf_names], [q + "mlp.experts." + mf])
                op.set_model_config(tc)
                op.optimizer_parallel_size = 1
                stacked = [np.stack([hf[p + f"mlp.experts.{e}" + h] for e in range(n)]) for h in hf_names]
                values[q + "mlp.experts." + mf] = op._hf_to_mf(stacked)[0]
    for op in ops:
        values.update(op.hf_to_mf({n: hf[n] for n in op.hf_names}))
    params = model.parameters_dict()
    filled = {k: ms.Parameter(ms.Tensor(v.reshape(params[k].shape)), name=k) for k, v in values.items() if k in params}
    not_loaded, _ = ms.load_param_into_net(model, filled)
    print("  deepseek_v3: not filled:", not_loaded, flush=True)
    assert all(k.endswith((".fi_accu", ".expert_load")) for k in not_loaded), not_loaded
    out = fresh(name)
    ms.save_checkpoint(model, os.path.join(out, f"{name}.safetensors"), format="safetensors")
    ref = np.load(os.path.join(source, "reference.npz"))
    np.savez(os.path.join(out, "reference.npz"), input_ids=ref["input_ids"], logits=ref["logits"])
    shutil.copyfile(os.path.join(source, "config.json"), os.path.join(out, "config.hf.json"))
    for p in model.get_parameters():
        print(f"  {name}: {p.name} {tuple(p.shape)}", flush=True)


def main(which):
    if "legacy" in which:
        make_legacy()
    if "mcore" in which or "moe" in which:
        from mindformers import build_context
        build_context({"use_legacy": False, "context": {"mode": "GRAPH_MODE", "device_target": "CPU"},
                       "parallel": {}})
        from mindformers.models.qwen3.configuration_qwen3 import Qwen3Config
        from mindformers.models.qwen3.modeling_qwen3_train import TrainingQwen3ForCausalLM
        if "mcore" in which:
            make_mcore("qwen3", TrainingQwen3ForCausalLM, Qwen3Config, ("safetensors", "ckpt"))
        from mindformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        from mindformers.models.qwen3_moe.modeling_qwen3_moe_train import TrainingQwen3MoeForCausalLM
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            reference = make_all_moe_folder(tmp)
            make_mcore("qwen3_moe", TrainingQwen3MoeForCausalLM, Qwen3MoeConfig, ("ckpt",), source=tmp,
                       reference=reference, num_experts=8, moe_grouped_gemm=True)
        make_deepseek_v3()


if __name__ == "__main__":
    if sys.argv[1:]:
        main(sys.argv[1:])
    else:           # MindFormers' context (use_legacy) is set once per process: one process per scheme
        import subprocess
        for part in ("legacy", "mcore"):
            subprocess.run([sys.executable, os.path.abspath(__file__), part], check=True)
