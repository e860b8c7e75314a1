"""``run_mode: predict`` through run_mindformer.py on a Hugging Face folder (tests/data/hf/qwen2, whose
generation stops at EOS on prompts 0 and 2): the three fixture prompts from a file as one batch of 3 give
transformers' ids in predict_results.jsonl, in PyNative and jit, with tokens/s printed; a JSONL of chat
messages is rendered with the folder's chat template; bad input exits 2 naming it before anything runs."""
import json
import os

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.data.tokenizer import build_tokenizer
from mindformers_core.training.config import load_config
from mindformers_core.training.predict import generation_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "tests", "data", "hf", "qwen2")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict")
    with open(os.path.join(ROOT, "configs", "llama_tiny.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": 16}}
    raw["train_dataset"].pop("tokenizer_file", None)
    config = tmp / "qwen2.yaml"
    with open(config, "w") as f:
        yaml.safe_dump(raw, f)
    ref = np.load(os.path.join(FOLDER, "reference.npz"))
    tok = build_tokenizer("hf", FOLDER)
    prompts = [tok.decode([int(t) for t in ref[f"prompt_{i}"]][1:]) for i in range(3)]
    assert [[1] + tok.encode(p, add_bos=False) for p in prompts] == [[int(t) for t in ref[f"prompt_{i}"]]
                                                                     for i in range(3)]
    lines = tmp / "prompts.txt"
    lines.write_text("\n".join(prompts) + "\n")
    return {"tmp": tmp, "config": str(config), "ref": ref, "prompts": prompts, "file": str(lines), "tok": tok}


def predict(s, out, *extra):
    return run_mindformer.main(["--config", s["config"], "--output_dir", str(out), "--run_mode", "predict",
                                "--pretrained_model_dir", FOLDER, "--load_checkpoint", FOLDER, *map(str, extra)])


@pytest.mark.parametrize("mode", [1, 0])
def test_a_file_of_prompts_as_one_batch_gives_transformers_ids(setup, mode, capsys):
    out = setup["tmp"] / f"out{mode}"
    code = predict(setup, out, "--predict_data", setup["file"], "--predict_batch_size", 3,
                   "--context.mode", mode)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [json.loads(line) for line in open(out / "predict_results.jsonl")]
    assert [r["prompt"] for r in rows] == setup["prompts"]
    for i, r in enumerate(rows):
        want = [int(t) for t in setup["ref"][f"generated_{i}"]]
        assert r["token_ids"] == want, i
        assert r["finish_reason"] == ("eos" if want[-1] == 2 else "length")
        assert r["text"] == setup["tok"].decode(want[1:])
    printed = captured.out.strip().splitlines()[-3:]
    assert printed == [r["text"] for r in rows]
    assert "prefill 26 tokens" in captured.err and "tokens/s" in captured.err


def test_one_prompt_streams_and_chat_messages_use_the_template(setup, capsys):
    chat = setup["tmp"] / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "Return the"}]}) + "\n"
                    + json.dumps({"prompt": setup["prompts"][1]}) + "\n")
    out = setup["tmp"] / "chat"      # the limit from the YAML's generation key (MindFormers' model_config)
    assert predict(setup, out, "--predict_data", str(chat), "--model.model_config.max_new_tokens", 4) == 0
    rows = [json.loads(line) for line in open(out / "predict_results.jsonl")]
    rendered = "<s><|user|>\nReturn the</s>\n<|assistant|>\n"
    assert rows[0]["token_ids"][:-len(rows[0]["new_token_ids"])] == setup["tok"].encode(rendered, add_bos=False)
    assert rows[1]["token_ids"] == [int(t) for t in setup["ref"]["generated_1"]][:9 + 4]
    assert len(rows[0]["new_token_ids"]) <= 4
    out_lines = capsys.readouterr().out.strip().splitlines()
    assert out_lines[-1] == rows[1]["text"]


@pytest.mark.parametrize("extra,words", [
    (["--predict_data", "x" * 200], "more than the model's maximum 64"),
    (["--top_p", 1.5, "--do_sample", "True"], "top_p=1.5: must be in (0, 1]"),
    (["--predict_batch_size", 0], "--predict_batch_size 0: must be a positive integer"),
    (["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2],
     "parallel_config.pipeline_stage = 2 with run_mode = 'predict': a pipelined KV cache"),
    (["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2],
     ("parallel_config.data_parallel = 2 with run_mode = 'predict'",
      "parallel_config.expert_parallel = 2 with run_mode = 'predict'")),
])
def test_bad_input_is_named_before_generation(setup, extra, words, capsys):
    out = setup["tmp"] / "bad"
    code = predict(setup, out, *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    for w in (words,) if isinstance(words, str) else words:
        assert w in err, err
    assert not (out / "predict_results.jsonl").exists()


def test_yaml_generation_keys_override_the_folder_and_the_flags_override_them(setup, tmp_path):
    """MindFormers' model_config generation keys are read (no longer dropped as not applied): over the folder's
    generation_config.json, under the flags; a limit given later replaces an earlier one; use_past is accepted."""
    with open(setup["config"]) as f:
        raw = yaml.safe_load(f)
    raw["model"]["model_config"].update(do_sample=True, top_k=5, top_p=0.9, temperature=0.7, repetition_penalty=1.1,
                                        max_decode_length=40, min_new_tokens=2, eos_token_id=[2, 7], use_past=True)
    raw["pretrained_model_dir"] = FOLDER
    path = tmp_path / "mf.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(path))
    assert "model.model_config.use_past" in "\n".join(cfg.report.summary("mf.yaml"))
    folder = {"max_new_tokens": 10, "temperature": 0.3, "top_p": 0.5, "eos_token_id": 2, "pad_token_id": 0}
    got = generation_config(setup["tok"], folder, dict(cfg.model.model_config), {"top_k": 9})
    assert (got.do_sample, got.top_k, got.top_p, got.temperature, got.repetition_penalty) == (True, 9, 0.9, 0.7, 1.1)
    assert (got.max_new_tokens, got.max_length, got.min_new_tokens) == (None, 40, 2)
    assert (got.eos_token_id, got.pad_token_id) == ([2, 7], 0)
    with_flag = generation_config(setup["tok"], folder, dict(cfg.model.model_config), {"max_new_tokens": 3})
    assert (with_flag.max_new_tokens, with_flag.max_length) == (3, None)


def test_a_bad_yaml_generation_value_is_named_by_its_key(setup, capsys):
    code = predict(setup, setup["tmp"] / "bad_yaml", "--model.model_config.top_p", 1.5,
                   "--model.model_config.temperature", 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.model_config.top_p = 1.5: must be in (0, 1]" in err, err
    assert "model.model_config.temperature = 0: must be > 0" in err, err


def test_a_broken_jsonl_prompt_file_is_named_by_its_line(setup, capsys):
    broken = setup["tmp"] / "broken.jsonl"
    broken.write_text(json.dumps({"prompt": "a"}) + "\n\n{not json}\n")
    code = predict(setup, setup["tmp"] / "broken", "--predict_data", str(broken))
    err = capsys.readouterr().err
    assert code == 2 and f"--predict_data {broken}:3: not valid JSON" in err, err
