"""Fine-tuning data (issue 33): MindFormers' HFDataLoader on local files, the handler chain, packing, and what
the loss sees, in one process.

* sources: JSON list, JSON lines, parquet, csv, arrow, a save_to_disk folder, a split slice; a hub name is refused
  naming the path tried;
* the Alpaca handler: the template's tokens are out of the loss, the response and EOS are in; the chat handler
  (the fixture folder's chat template): only assistant turns are targets;
* packing: positions restart at each document, segment ids number them, padding is masked; ``truncate`` fills
  rows; padding only without packing;
* packing parity: one packed row holding documents A and B gives the loss and gradients of A and B as two
  padded rows (PyNative and jit);
* loss-mask parity: the model's loss on a batch of the pipeline = a NumPy masked mean of its per-token losses;
* bad input (a broken JSON line, a column the handler needs, a hub name) is named by run_mindformer.py with
  exit 2 before anything trains.
"""
import json
import os

import numpy as np
import pytest

from mindformers_core.common.batch import model_args, stack_samples
from mindformers_core.data import HFTokenizer, SFTDataset, build_rows, build_sft_rows, hf_sft_dataset, load_hf_dataset
from mindformers_core.data.handlers import ALPACA_PROMPT_NO_INPUT, parse_handlers
from mindformers_core.data.hf_dataset import feed_keys
from mindformers_core.data.packing import make_document

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "data", "hf", "qwen3")
ALPACA = os.path.join(HERE, "data", "sft", "alpaca_arith.json")
YAML = os.path.join(HERE, "data", "mindformers_configs", "finetune_qwen3.yaml")
CHAIN = [{"type": "take", "n": 2000},
         {"type": "AlpacaInstructDataHandler", "seq_length": 4096, "padding": False,
          "tokenizer": {"trust_remote_code": True, "padding_side": "right"}},
         {"type": "PackingHandler", "seq_length": 4096, "pack_strategy": "pack"}]
COLUMNS = ["input_ids", "labels", "loss_mask", "position_ids"]


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer(FOLDER)


@pytest.fixture(scope="module")
def records():
    with open(ALPACA) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------ sources
def _write_all_formats(root, records):
    import datasets
    ds = datasets.Dataset.from_list(records)
    paths = {"json": os.path.join(root, "a.json"), "jsonl": os.path.join(root, "a.jsonl"),
             "parquet": os.path.join(root, "a.parquet"), "csv": os.path.join(root, "a.csv"),
             "disk": os.path.join(root, "saved")}
    with open(paths["json"], "w") as f:
        json.dump(records, f)
    with open(paths["jsonl"], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    ds.to_parquet(paths["parquet"])
    ds.to_csv(paths["csv"], index=False)
    ds.save_to_disk(paths["disk"])
    arrow = [os.path.join(paths["disk"], n) for n in os.listdir(paths["disk"]) if n.endswith(".arrow")]
    paths["arrow"] = arrow[0]
    return paths


def test_every_local_format_reads_the_same_records(tmp_path, records):
    paths = _write_all_formats(str(tmp_path), records[:12])
    cache = str(tmp_path / "cache")
    for kind, path in paths.items():
        ds = load_hf_dataset(path, cache_dir=cache)
        got = [{k: ("" if r[k] is None else str(r[k])) for k in ("instruction", "input", "output")} for r in ds]
        assert got == records[:12], kind
    ds = load_hf_dataset(paths["disk"], load_func="load_from_disk")
    assert len(ds) == 12
    assert len(load_hf_dataset(paths["jsonl"], split="train[:5]", cache_dir=cache)) == 5
    assert len(load_hf_dataset("json", data_files=paths["jsonl"], cache_dir=cache)) == 12


def test_a_hub_name_is_not_downloaded_and_the_path_tried_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"no such local file or folder \(tried .*llm-wizard/alpaca-gpt4-data-zh\).*"
                                         r"download it first"):
        load_hf_dataset("llm-wizard/alpaca-gpt4-data-zh")


def test_a_broken_json_line_is_named_by_file_and_line(tmp_path, records):
    path = str(tmp_path / "broken.jsonl")
    lines = [json.dumps(r) for r in records[:6]]
    lines[3] = lines[3][:-5]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"{path}:4: not valid JSON"):
        load_hf_dataset(path)
    listed = str(tmp_path / "broken.json")
    with open(listed, "w") as f:
        f.write(json.dumps(records[:3], indent=1)[:-30] + "\n")
    with pytest.raises(ValueError, match=f"{listed}:\\d+: not valid JSON"):
        load_hf_dataset(listed)


# ------------------------------------------------------------------------------------------------ handlers
def test_alpaca_prompt_is_out_of_the_loss_and_the_response_in(tok, records, tmp_path):
    ds = load_hf_dataset(ALPACA, cache_dir=str(tmp_path))
    rows = build_sft_rows(ds, CHAIN[:2], tok, 256)              # packing off: one record per padded row
    assert len(rows) == 50
    for row, rec in zip(rows[:3] + rows[-3:], records[:3] + records[-3:]):
        kept = row["labels"][row["loss_mask"] == 1]
        assert tok.decode(kept) == rec["output"] and kept[-1] == tok.eos_token_id
        prompt = tok.decode(row["input_ids"][row["loss_mask"] == 0])
        assert prompt.startswith("Below is an instruction") and rec["instruction"] in prompt
    row = rows[0]
    assert tok.decode(row["input_ids"][:row["loss_mask"].argmax() + 1]) == \
        ALPACA_PROMPT_NO_INPUT.format(instruction=records[0]["instruction"])
    n = int((row["input_ids"] != tok.pad_token_id).sum())
    assert (row["labels"][n:] == tok.pad_token_id).all() and (row["loss_mask"][n:] == 0).all()
    assert "Input:\ncat" in tok.decode(rows[30]["input_ids"])                   # records with an input


def test_chat_handler_targets_only_the_assistant_turns(tok, tmp_path):
    path = str(tmp_path / "chat.jsonl")
    convs = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
              {"role": "assistant", "content": "6"}],
             [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]]
    with open(path, "w") as f:
        f.writelines(json.dumps({"messages": c}) + "\n" for c in convs)
    ds = hf_sft_dataset(path, [{"type": "ChatTemplateDataHandler"}], tok, 128, cache_dir=str(tmp_path / "c"))
    first = ds.rows[0]
    kept = first["labels"][first["loss_mask"] == 1]
    assert tok.decode(kept, skip_special_tokens=False) == "4</s>\n6</s>\n"
    whole = tok.decode(first["input_ids"], skip_special_tokens=False)
    assert whole.startswith("<s><|system|>\nBe brief.</s>\n<|user|>\n2+2?</s>\n<|assistant|>\n4")
    assert first["input_ids"][0] == tok.bos_token_id                   # '<s>' in the template is the BOS id
    with pytest.raises(ValueError, match="needs column"):
        hf_sft_dataset(path, [{"type": "ChatTemplateDataHandler", "messages_key": "conversation"}], tok, 64,
                       cache_dir=str(tmp_path / "c"))


def test_column_handlers_and_a_missing_column_named(tok, tmp_path):
    path = str(tmp_path / "q.jsonl")
    with open(path, "w") as f:
        for i in range(6):
            f.write(json.dumps({"question": f"What is {i} plus 1?", "answer": str(i + 1), "junk": i}) + "\n")
    chain = [{"type": "select_columns", "column_names": ["question", "answer"]},
             {"type": "rename_columns", "column_mapping": {"question": "instruction", "answer": "output"}},
             {"type": "skip", "n": 1}, {"type": "take", "n": 3}, {"type": "AlpacaInstructDataHandler"}]
    ds = hf_sft_dataset(path, chain, tok, 160, cache_dir=str(tmp_path / "c"))
    assert ds.num_samples == 3
    assert tok.decode(ds.rows[0]["labels"][ds.rows[0]["loss_mask"] == 1]) == "2"
    with pytest.raises(ValueError, match=r"AlpacaInstructDataHandler needs column\(s\) \['instruction', 'output'\]"):
        hf_sft_dataset(path, [{"type": "AlpacaInstructDataHandler"}], tok, 160, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"column\(s\) \['nope'\] not in the dataset"):
        hf_sft_dataset(path, [{"type": "rename_column", "original_column_name": "nope", "new_column_name": "x"},
                              {"type": "AlpacaInstructDataHandler"}], tok, 160, cache_dir=str(tmp_path / "c"))


def test_a_bad_chain_names_every_problem():
    with pytest.raises(ValueError) as info:
        parse_handlers([{"type": "PackingHandler", "pack_strategy": "zip"}, {"type": "Tokenize"}, {"type": "take"}])
    text = str(info.value)
    for part in ("handler[0].pack_strategy = 'zip'", "handler[0] (type PackingHandler): packs tokenized",
                 "handler[1].type = 'Tokenize': not a handler here", "handler[2] (type take): needs ['n']",
                 "no tokenizing handler"):
        assert part in text, text


# ------------------------------------------------------------------------------------------------ packing
def _doc(n, first, prompt):
    ids = list(range(first, first + n + 1))
    return make_document(ids[:prompt], ids[prompt:])


def test_pack_restarts_positions_and_numbers_documents():
    docs = [_doc(5, 10, 2), _doc(4, 30, 1), _doc(6, 50, 3), _doc(20, 70, 4)]
    rows = build_rows(docs, 12, pad_id=0, strategy="pack")
    assert len(rows) == 3                                   # [5 + 4 + pad 3], [6 + pad 6], [cut 12]
    r = rows[0]
    assert r["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]
    assert r["segment_ids"].tolist() == [0] * 5 + [1] * 4 + [2] * 3
    assert r["loss_mask"].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    assert r["input_ids"][:9].tolist() == [10, 11, 12, 13, 14, 30, 31, 32, 33]
    assert r["labels"][:9].tolist() == [11, 12, 13, 14, 15, 31, 32, 33, 34] and r["labels"][9:].tolist() == [0] * 3
    assert rows[2]["loss_mask"].sum() == 12 - 3 and rows[2]["segment_ids"].max() == 0
    capped = build_rows(docs[:2], 12, 0, "pack", max_documents=1)       # compressed_eod_mask_length 1
    assert len(capped) == 2


def test_truncate_fills_rows_and_padding_only_without_packing():
    docs = [_doc(5, 10, 2), _doc(4, 30, 1), _doc(6, 50, 3)]
    rows = build_rows(docs, 6, pad_id=0, strategy="truncate")
    assert len(rows) == 2 and all(r["loss_mask"].size == 6 for r in rows)        # 15 positions -> 2 rows of 6
    assert rows[0]["position_ids"].tolist() == [0, 1, 2, 3, 4, 0]
    assert rows[1]["position_ids"].tolist() == [1, 2, 3, 0, 1, 2]                # B continues, C starts
    assert rows[1]["segment_ids"].tolist() == [0, 0, 0, 1, 1, 1]
    padded = build_rows(docs, 8, pad_id=0)
    assert len(padded) == 3 and padded[0]["loss_mask"].tolist() == [0, 1, 1, 1, 1, 0, 0, 0]
    assert feed_keys(COLUMNS, packed=False) == COLUMNS
    assert feed_keys(COLUMNS, packed=True) == COLUMNS + ["segment_ids"]


def test_dataset_order_is_split_over_data_parallel_ranks_and_resumes(tok, tmp_path):
    ds = load_hf_dataset(ALPACA, cache_dir=str(tmp_path))
    rows = build_sft_rows(ds, CHAIN, tok, 256)
    ranks = [SFTDataset(rows, seed=3, shuffle=True, dp_rank=r, dp_size=2) for r in range(2)]
    seen = [[int(s["input_ids"].sum() * 1000 + s["loss_mask"].sum()) for s in d] for d in ranks]
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(rows) // 2
    again = SFTDataset(rows, seed=3, shuffle=True, dp_rank=0, dp_size=2)
    it = iter(again)
    next(it), next(it)
    state = again.state_dict()
    resumed = SFTDataset(rows, seed=3, shuffle=True, dp_rank=0, dp_size=2)
    resumed.load_state_dict(state)
    assert [int(s["input_ids"].sum() * 1000 + s["loss_mask"].sum()) for s in resumed] == seen[0][2:]


# ------------------------------------------------------------------------------------------------ the loss
def _model(vocab, seq):
    import mindspore as ms
    from mindformers_core.transformer import GPTModel, TransformerConfig
    ms.set_seed(0)
    return GPTModel(TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                                      vocab_size=vocab, seq_length=seq, ffn_hidden_size=48))


def _grads(m, batch, mode):
    import mindspore as ms
    from mindspore import Tensor
    args = model_args(batch, Tensor)
    grad_fn = ms.value_and_grad(m, None, m.trainable_params())
    if mode == "jit":
        grad_fn = ms.jit(grad_fn)
    loss, grads = grad_fn(*args)
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_one_packed_row_equals_the_documents_as_padded_rows(tok, records, mode):
    """Documents A and B (two Alpaca records) packed into one row give the loss and the gradients of A and B
    as two padded rows: the row's mask keeps them apart, positions restart at B, the mean runs over the same
    response tokens."""
    seq = 256
    a, b = records[3], records[5]
    from mindformers_core.data.handlers import alpaca_documents
    docs = alpaca_documents([a, b], tok)
    assert sum(len(d["input_ids"]) for d in docs) <= seq
    keys = feed_keys(COLUMNS, packed=True)
    packed = stack_samples([{k: r[k] for k in keys} for r in build_rows(docs, seq, tok.pad_token_id, "pack")])
    apart = stack_samples([{k: r[k] for k in feed_keys(COLUMNS, False)}
                           for r in build_rows(docs, seq, tok.pad_token_id)])
    assert packed["input_ids"].shape == (1, seq) and apart["input_ids"].shape == (2, seq)
    assert packed["loss_mask"].sum() == apart["loss_mask"].sum() > 2
    m = _model(tok.vocab_size, seq)
    loss_p, grads_p = _grads(m, packed, mode)
    loss_a, grads_a = _grads(m, apart, mode)
    assert loss_p == pytest.approx(loss_a, rel=1e-5)
    worst = max(float(np.abs(x - y).max() / (np.abs(y).max() + 1e-12)) for x, y in zip(grads_p, grads_a))
    assert worst < 1e-5, worst                    # measured 5.1e-7 (PyNative), 5.7e-7 (jit); the loss bitwise
    # without segment ids B's tokens see A's: another loss (the mask is what separates them)
    leaky = {k: v for k, v in packed.items() if k != "segment_ids"}
    assert abs(_grads(m, leaky, "pynative")[0] - loss_a) > 1e-4


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_loss_is_the_numpy_masked_mean_of_a_pipeline_batch(tok, tmp_path):
    from mindspore import Tensor
    ds = hf_sft_dataset(ALPACA, CHAIN, tok, 256, input_columns=COLUMNS, cache_dir=str(tmp_path))
    batch = stack_samples([ds.sample(i) for i in range(3)])
    assert set(batch) == {"input_ids", "labels", "loss_mask", "position_ids", "segment_ids"}
    m = _model(tok.vocab_size, 256)
    logits = m(Tensor(batch["input_ids"]), None, None, Tensor(batch["position_ids"]),
               Tensor(batch["segment_ids"])).asnumpy().astype(np.float64)
    per_token = -np.take_along_axis(_log_softmax(logits), batch["labels"][..., None].astype(np.int64), -1)[..., 0]
    mask = batch["loss_mask"]
    want = (per_token * mask).sum() / mask.sum()
    got = float(m(*model_args(batch, Tensor)).asnumpy())
    assert got == pytest.approx(want, rel=1e-5)
    assert abs(got - per_token.mean()) > 1e-3                            # the prompt and padding are out
    assert 0 < mask.sum() < mask.size / 4


# ------------------------------------------------------------------------------------------------ the trainer
def _run(tmp_path, *extra):
    import run_mindformer
    out = tmp_path / "out"
    code = run_mindformer.main(["--config", YAML, "--use_parallel", "False", "--pretrained_model_dir", FOLDER,
                                "--load_checkpoint", FOLDER, "--parallel_config.model_parallel", "1",
                                "--parallel_config.pipeline_stage", "1", "--model.model_config.compute_dtype",
                                "float32", "--model.model_config.seq_length", "256", "--output_dir", str(out),
                                *map(str, extra)])
    return code, out


@pytest.mark.parametrize("case", ["broken_line", "missing_column", "hub_name"])
def test_bad_data_is_named_before_anything_trains(tmp_path, capsys, records, case):
    if case == "broken_line":
        path = str(tmp_path / "data.jsonl")
        lines = [json.dumps(r) for r in records[:8]]
        lines[5] = '{"instruction": "What is 1 plus 1?", "output": "2"'
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        message = f"{path}:6: not valid JSON"
    elif case == "missing_column":
        path = str(tmp_path / "data.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps({"prompt": r["instruction"], "output": r["output"]}) + "\n" for r in records)
        message = "AlpacaInstructDataHandler needs column(s) ['instruction']; train_dataset.data_loader.path "
    else:
        path = "someone/some-dataset"
        message = "train_dataset.data_loader.path = 'someone/some-dataset': no such local file or folder (tried "
    code, out = _run(tmp_path, "--train_dataset.data_loader.path", path, "--runner_config.max_steps", 1)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not os.path.exists(out / "loss.jsonl")


@pytest.mark.parametrize("extra, message", [
    (["--parallel_config.data_parallel", 2, "--pretrained_model_dir", "''", "--load_checkpoint", "''",
      "--model.model_config.num_layers", 2,
      "--model.model_config.hidden_size", 32, "--model.model_config.num_heads", 4,
      "--model.model_config.vocab_size", 320],
     "'HFDataLoader': the handlers need the model's tokenizer; give pretrained_model_dir"),
    (["--parallel_config.data_parallel", 2, "--train_dataset.data_loader.handler",
      "[{type: take, n: 5}, {type: PackingHandler}]"],
     "handler[1] (type PackingHandler): packs tokenized documents, so it comes after the tokenizing handler"),
])
def test_what_the_data_cannot_feed_is_named_by_check_config(tmp_path, capsys, extra, message):
    import run_mindformer
    code = run_mindformer.main(["--config", YAML, "--pretrained_model_dir", FOLDER, "--load_checkpoint", FOLDER,
                                "--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
                                "--model.model_config.compute_dtype", "float32", "--model.model_config.seq_length",
                                "256", "--train_dataset.data_loader.path", ALPACA, "--output_dir", str(tmp_path),
                                *map(str, extra), "--check_config", "--worker_num", "2"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def _sum(k):
    """The update of plain_step_fn reduced to what it sees: the gradients (divided by k as PlainReduce does)."""
    from mindspore import nn

    class Sum(nn.Cell):
        def construct(self, grads, loss):
            return loss, tuple(g / k for g in grads), loss
    update = Sum()
    update.eager = update
    return update


class _OneRank:
    generator = None

    def _group_of(self, generator, token):
        return [0]


def test_accumulation_weights_micro_steps_by_their_unmasked_tokens(tok, records, mode="pynative"):
    """(PyNative: the weights are taken on the host around the compiled gradient function, the same code in both
    modes; a jit variant compiles three seq-256 gradient graphs, ~1 min on the loaded 2 cores.)
    The trainer's accumulating step (gradient_accumulation_steps 2, one row per micro-step) = one micro-step
    of both rows, in loss and gradients: each micro-step's masked mean is weighted by its share of the step's
    unmasked tokens (TokenWeights), so the loss is the mean over every unmasked token of the batch. The rows'
    counts differ: the plain mean of the two micro-steps' means (no weights) is another number."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.training.steps import TokenWeights, plain_step_fn
    from mindformers_core.data.handlers import alpaca_documents
    docs = alpaca_documents(records[:20], tok)
    kept = [sum(d["loss_mask"]) for d in docs]
    docs = [docs[0], next(d for d, n in zip(docs, kept) if n != kept[0])]     # two rows, unequal counts
    batch = stack_samples([{k: r[k] for k in feed_keys(COLUMNS, False)} for r in build_rows(docs, 256, tok.pad_token_id)])
    counts = batch["loss_mask"].sum(1)
    assert counts[0] != counts[1]
    m = _model(tok.vocab_size, 256)
    args = model_args(batch, Tensor)
    grad_fn = ms.value_and_grad(m, None, m.trainable_params())
    whole = plain_step_fn(grad_fn, _sum(1), 1, mode == "jit", model=m)
    loss_w, grads_w = whole(*args)
    weighted = plain_step_fn(grad_fn, _sum(2), 2, mode == "jit", model=m, weights=TokenWeights(_OneRank()))
    loss_a, grads_a = weighted(*args)
    assert float(loss_a.asnumpy()) == pytest.approx(float(loss_w.asnumpy()), rel=1e-5)
    grads_a, grads_w = [g.asnumpy() for g in grads_a], [g.asnumpy() for g in grads_w]
    worst = max(float(np.abs(x - y).max() / (np.abs(y).max() + 1e-12)) for x, y in zip(grads_a, grads_w))
    assert worst < 1e-5, worst
    plain = plain_step_fn(grad_fn, _sum(2), 2, mode == "jit", model=m)
    assert abs(float(plain(*args)[0].asnumpy()) - float(loss_w.asnumpy())) > 1e-4


def test_pynative_dialect_spells_hfdataloader_as_the_graph_dialect():
    """MindFormers' PyNative YAMLs write the loader under train_dataset.dataloader: the same HFDataLoader keys
    (path, load_func, split, handler, create_attention_mask, ...) and input_columns give the same train_dataset."""
    import yaml
    from mindformers_core.training.dialects import translate
    with open(YAML) as f:
        ds = yaml.safe_load(f)["train_dataset"]
    graph, _, errors_g = translate({"train_dataset": ds}, 1, "graph")
    pynative = {"training": {"steps": 1},
                "train_dataset": {"dataloader": ds["data_loader"], "input_columns": ds["input_columns"]}}
    out, _, errors_p = translate(pynative, 1, "pynative")
    assert not errors_p, errors_p
    want = {k: v for k, v in graph["train_dataset"].items() if k in out["train_dataset"]}
    assert out["train_dataset"] == want and {"handler", "input_columns", "path"} <= set(want)
