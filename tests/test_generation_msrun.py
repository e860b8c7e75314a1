"""Parallel predict under msrun through ``run_mindformer.main`` (``run_mode: predict``, ``--use_parallel True``,
model_parallel 2) on the Qwen3-MoE fixture (GQA, q/k norm, experts): the three fixture prompts from a file
(PyNative: one batch, 8 new tokens; jit: batches of 2, the second one prompt left-padded to the longest of all
and filled up with a copy, its text streamed, 32 new tokens) give transformers' greedy ids in rank 0's
predict_results.jsonl; every decode step's logits on each rank = a full one-process forward over the same
prefix (1e-5 of the largest); each rank holds the KV-cache slice of its key/value heads and half the query
projection; only rank 0 prints. The DeepSeek-V3 fixture in PyNative (multi-latent attention's compressed cache,
interleaved rope, noaux_tc experts), one batch of the three prompts and 6 new tokens (its jit cache path is proven
by tests/test_generation.py on one process): transformers'
ids, the one-process full forward's logits, each rank the whole latent cache (every head needs the latents)
and half of the q up-projection.

One job in the suite's batched 2-worker launch (tests/msrun_batch.py): both modes run in turn
(tests/bodies/generation_tp_body.py records every step)."""
import functools
import json
import os
import tempfile

import numpy as np
import pytest
import yaml

from mindformers_core.data.tokenizer import build_tokenizer
from tests.msrun_batch import computed_ahead, job

pytestmark = pytest.mark.msrun
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "tests", "data", "hf", "qwen3_moe")
DEEPSEEK = os.path.join(ROOT, "tests", "data", "hf", "deepseek_v3")
MODES = {"pynative": 1, "jit": 0}
# PyNative (the slow mode): the three prompts as one batch, 8 new tokens (the YAML's max_new_tokens); jit: batches
# of 2 (the second padded to the run's longest prompt and filled up with a copy), all 32 new tokens
RUNS = {"pynative": {"batch": 3, "new": 8}, "jit": {"batch": 2, "new": 32}}


def predict_yaml(root: str, folder: str = FOLDER) -> str:
    """configs/llama_tiny.yaml with the model, weights and tokenizer taken from the folder."""
    with open(os.path.join(ROOT, "configs", "llama_tiny.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": 16}}
    raw["train_dataset"].pop("tokenizer_file", None)
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = folder
    path = os.path.join(root, f"predict_{os.path.basename(folder)}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return path


def fixture_prompts(folder=FOLDER):
    ref = np.load(os.path.join(folder, "reference.npz"))
    tok = build_tokenizer("hf", folder)
    ids = [[int(t) for t in ref[f"prompt_{i}"]] for i in range(3)]
    texts = [tok.decode(p[1:]) for p in ids]                 # BOS first, then the text
    return ref, tok, ids, texts


@functools.lru_cache(maxsize=None)
def plan():
    """The config, the prompt file and one argv per mode (made once per process)."""
    base = tempfile.mkdtemp(prefix="generation_msrun_")
    config = predict_yaml(base)
    _, _, _, texts = fixture_prompts()
    prompts = os.path.join(base, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("\n".join(texts) + "\n")
    out = {mode: os.path.join(base, mode) for mode in MODES}
    argvs = [["--config", config, "--output_dir", out[mode], "--run_mode", "predict", "--use_parallel", "True",
              "--parallel_config.model_parallel", "2", "--predict_data", prompts, "--predict_batch_size",
              str(RUNS[mode]["batch"]), "--model.model_config.max_new_tokens", str(RUNS[mode]["new"]),
              "--context.mode", str(flag)] for mode, flag in MODES.items()]
    _, _, _, ds_texts = fixture_prompts(DEEPSEEK)
    ds_prompts = os.path.join(base, "deepseek_prompts.txt")
    with open(ds_prompts, "w") as f:
        f.write("\n".join(ds_texts) + "\n")
    out["deepseek"] = os.path.join(base, "deepseek")
    argvs.append(["--config", predict_yaml(base, DEEPSEEK), "--output_dir", out["deepseek"], "--run_mode", "predict",
                  "--use_parallel", "True", "--parallel_config.model_parallel", "2", "--predict_data", ds_prompts,
                  "--predict_batch_size", "3", "--model.model_config.max_new_tokens", "6", "--context.mode", "1"])
    return out, argvs


TP2 = job("generation_predict_tp2", 2, "tests.bodies.generation_tp_body:run", lambda: {"argvs": plan()[1]},
          timeout=600, group=__name__)


@pytest.fixture(scope="module")
def runs():
    results = TP2.results()
    assert len(results) == 2
    assert [[r["code"] for r in rank] for rank in results] == [[0, 0, 0], [0, 0, 0]]
    return {mode: [rank[i] for rank in results] for i, mode in enumerate([*MODES, "deepseek"])}


def full_forward_logits(ids, folder=FOLDER):
    """Logits (n, vocab) of the one-process model over a row's whole sequence (positions as inputs, no cache,
    PyNative)."""
    import mindspore as ms
    x = ms.Tensor(np.asarray(ids, np.int32)[None])
    pos = ms.Tensor(np.arange(len(ids), dtype=np.int32)[None])
    return _model(folder)(x, None, None, pos).asnumpy()[0]


@computed_ahead
def qwen3_moe_full_forwards():
    """The one-process full-forward logits of the Qwen3-MoE fixture's three generated rows (whole)."""
    ref, _, _, _ = fixture_prompts()
    return [full_forward_logits([int(t) for t in ref[f"generated_{i}"]]) for i in range(3)]


@computed_ahead
def deepseek_full_forwards():
    """The same for the DeepSeek-V3 fixture's rows, up to their 6th new token."""
    ref, _, ids, _ = fixture_prompts(DEEPSEEK)
    return [full_forward_logits([int(t) for t in ref[f"generated_{i}"]][:len(ids[i]) + 6], DEEPSEEK)
            for i in range(3)]


@functools.lru_cache(maxsize=None)
def _model(folder=FOLDER):
    from mindformers_core.models.hf.pretrained import from_pretrained
    model = from_pretrained(folder, seq_length=64)
    model.set_train(False)
    return model


@pytest.mark.parametrize("mode", MODES)
def test_tp2_predict_writes_transformers_ids_and_only_rank0_prints(runs, mode):
    ref, tok, ids, texts = fixture_prompts()
    want = [[int(t) for t in ref[f"generated_{i}"]][:len(ids[i]) + RUNS[mode]["new"]] for i in range(3)]
    rows = [json.loads(line) for line in open(os.path.join(plan()[0][mode], "predict_results.jsonl"))]
    assert [r["prompt"] for r in rows] == texts
    assert [r["token_ids"] for r in rows] == want
    assert [r["finish_reason"] for r in rows] == ["length"] * 3
    rank0, rank1 = (r["printed"] for r in runs[mode])
    for r in rows:
        assert r["text"] in rank0 and r["text"] not in rank1
    assert rank0.rstrip().endswith(rows[2]["text"])          # jit: the one-prompt batch, streamed


@pytest.mark.parametrize("mode", MODES)
def test_tp2_every_step_equals_a_one_process_full_forward(runs, mode):
    _, _, ids, _ = fixture_prompts()
    full = qwen3_moe_full_forwards()
    heads = json.load(open(os.path.join(FOLDER, "config.json")))["num_key_value_heads"]
    for rank, res in enumerate(runs[mode]):
        calls = res["calls"]
        if RUNS[mode]["batch"] == 3:                          # one batch of the three prompts
            rows = [(0, 0, 0), (0, 1, 1), (0, 2, 2)]
        else:                                                 # prompts 0, 1; then prompt 2 and its filler
            rows = [(0, 0, 0), (0, 1, 1), (1, 0, 2)]
        assert len(calls) == rows[-1][0] + 1
        for call, row, i in rows:                             # (call, row in the batch, prompt)
            got = calls[call]["logits"][:, row, :]            # (steps, vocab): prefill, then the decode steps
            assert got.shape[0] == RUNS[mode]["new"]
            n = len(ids[i])
            one = full[i][n - 1:n - 1 + got.shape[0]]
            err = np.abs(got - one).max() / np.abs(one).max()
            assert err <= 1e-5, f"rank {rank} {mode} prompt {i}: logits {err:.2e}"
        b, g, length, d = calls[0]["cache"]
        assert (b, g * 2) == (RUNS[mode]["batch"], heads)      # this rank's key/value heads only
        assert length == 12 + RUNS[mode]["new"]                # the longest prompt + the new tokens
        rows_in, cols_out = _q_shape()                           # (hidden, heads x head_dim): columns split
        assert calls[0]["linear_q"] == (rows_in, cols_out // 2)


def _q_shape():
    return tuple(dict(_model().parameters_and_names())["decoder.layers.0.self_attention.linear_q.weight"].shape)


def test_tp2_deepseek_v3_decodes_from_the_compressed_cache(runs):
    ref, _, ids, texts = fixture_prompts(DEEPSEEK)
    want = [[int(t) for t in ref[f"generated_{i}"]][:len(ids[i]) + 6] for i in range(3)]
    rows = [json.loads(line) for line in open(os.path.join(plan()[0]["deepseek"], "predict_results.jsonl"))]
    assert [r["prompt"] for r in rows] == texts and [r["token_ids"] for r in rows] == want
    config = json.load(open(os.path.join(DEEPSEEK, "config.json")))
    q_up = dict(_model(DEEPSEEK).parameters_and_names())["decoder.layers.0.self_attention.linear_q_up_proj.weight"]
    for rank, res in enumerate(runs["deepseek"]):
        [call] = res["calls"]
        assert call["cache"] == (3, 1, 12 + 6, config["kv_lora_rank"])      # the whole latent on every rank
        assert call["linear_q"] == (q_up.shape[0], q_up.shape[1] // 2)      # its heads split
        for i in range(3):
            n = len(ids[i])
            one = deepseek_full_forwards()[i][n - 1:n - 1 + 6]
            err = np.abs(call["logits"][:, i, :] - one).max() / np.abs(one).max()
            assert err <= 1e-5, f"rank {rank} prompt {i}: logits {err:.2e}"
