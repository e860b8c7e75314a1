"""Fine-tuning data accounted honestly (issue 42 item 1), in one process.

MindFormers' finetune_qwen3.yaml at seq_length 128 on Alpaca records whose prompt alone passes 128 tokens: cut at
the end (MindFormers' AlpacaInstructDataHandler: ``input_ids[:seq_length]``) 45 of 60 rows kept no target token,
a batch of two such rows had the masked mean 0/0 = NaN and the bad-step guard called it a numerical fault. The
rules (data/truncation.py, data/hf_dataset.py, transformer/loss.py, training/trainer.py):

* the prompt is cut first (its earliest tokens, BOS kept), the response keeps its tokens (at least half the
  budget when it needs it); the chat handler drops earlier turns and keeps the last answer;
* PackingHandler ``pack`` skips records longer than its own seq_length, as MindFormers' ``pack_examples`` does;
* a record still without a target token is dropped and counted once at start-up (before any process group),
  named by data set and record; a data set with none is refused (exit 2);
* a loss_mask keeping no token gives loss 0 and gradient 0 (not NaN), and a global batch without a target token
  is logged as such: no update (weights and AdamW moments unchanged), not a fault, not counted toward the
  guard's skipped steps in a row.
"""
import json
import os

import numpy as np
import pytest

from mindformers_core.common.batch import model_args, stack_samples
from mindformers_core.data import HFTokenizer, SFTDataset, load_hf_dataset
from mindformers_core.data.handlers import alpaca_documents, chat_renderer, chat_turns
from mindformers_core.data.hf_dataset import NoTargetTokens, sft_rows
from mindformers_core.data.truncation import Turn, fit, share
from tests.test_sft_data import ALPACA, CHAIN, FOLDER, YAML, _OneRank, _log_softmax, _model, _sum
from tests.test_trainer import records as logged

SEQ = 128


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer(FOLDER)


def long_records(n=60):
    """Alpaca records as the user's: every fourth with a short instruction, the others with one whose prompt
    passes 128 tokens of the fixture's tokenizer; short answers."""
    rng = np.random.default_rng(7)
    words = "add the numbers then write the sum of seven and three plus nine minus two".split()
    out = []
    for i in range(n):
        k = 4 if i % 4 == 0 else 60
        out.append({"instruction": " ".join(rng.choice(words, k)), "input": "", "output": f"The answer is {i}."})
    return out


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("long") / "long.json")
    with open(path, "w") as f:
        json.dump(long_records(), f)
    return path


def numpy_masked_mean(m, batch):
    """NumPy's mean of the per-token losses over the kept tokens, from the model's logits (float64)."""
    from mindspore import Tensor
    logits = m(Tensor(batch["input_ids"])).asnumpy().astype(np.float64)
    per_token = -np.take_along_axis(_log_softmax(logits), batch["labels"][..., None].astype(np.int64), -1)[..., 0]
    mask = batch["loss_mask"].astype(np.float64)
    with np.errstate(invalid="ignore"):
        return (per_token * mask).sum() / mask.sum()


# ------------------------------------------------------------------------------------------------ the cut
def test_share_and_fit_rules_on_token_lists():
    assert share(10, 4, 20) == (10, 4)                       # fits: nothing cut
    assert share(10, 4, 8) == (4, 4)                         # a long prompt is cut, the short answer kept whole
    assert share(3, 20, 8) == (3, 5)                         # a short prompt kept, the answer takes the rest
    assert share(10, 20, 8) == (4, 4)                        # both long: the answer keeps half
    bos, prompt, answer = 1, [1] + list(range(10, 19)), [50, 51, 52, 53]
    ids, target, cut = fit([Turn("user", [(prompt, 0)]), Turn("assistant", [(answer, 1)])], 8, bos)
    assert cut and ids == [1, 16, 17, 18, 50, 51, 52, 53] and target == [0, 0, 0, 0, 1, 1, 1, 1]
    ids, _, cut = fit([Turn("user", [(prompt, 0)]), Turn("assistant", [(answer, 1)])], 14, bos)
    assert not cut and ids == prompt + answer
    # a conversation: earlier exchanges go first (question and answer together), the system turn and the last
    # exchange stay; a trailing unanswered turn trains nothing and goes at once
    turns = [Turn("system", [([1, 2, 3], 0)]),
             Turn("user", [([10, 11, 12], 0)]), Turn("assistant", [([20], 0), ([21, 22], 1)]),
             Turn("user", [([30, 31], 0)]), Turn("assistant", [([40], 0), ([41, 42], 1)]),
             Turn("user", [([35, 36], 0)]), Turn("assistant", [([45], 0), ([46, 47], 1)]),
             Turn("user", [([60] * 9, 0)])]
    ids, target, cut = fit(turns, 16, bos)
    assert cut and ids == [1, 2, 3, 30, 31, 40, 41, 42, 35, 36, 45, 46, 47]
    assert target == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    ids, target, cut = fit(turns, 8, bos)                   # every earlier exchange dropped
    assert ids == [1, 2, 3, 35, 36, 45, 46, 47] and target == [0] * 6 + [1, 1]
    ids, target, cut = fit(turns, 4, bos)                   # then the prompt is cut, BOS first, the answer kept
    assert ids == [1, 45, 46, 47] and target == [0, 0, 1, 1]
    ids, target, cut = fit([Turn("user", [([1, 5, 6, 7], 0)])], 3, bos)   # no target at all: nothing to keep
    assert cut and sum(target) == 0


def test_alpaca_prompt_is_cut_first_and_every_response_kept(tok, long_file):
    """The user's case: cut at its end, 45 of the 60 records keep no target token (NumPy's masked mean of a
    batch of two of them is 0/0); cut prompt first, every record keeps its whole answer and the loss is
    NumPy's masked mean, finite."""
    recs = long_records()
    whole = alpaca_documents(recs, tok)
    end_cut = [float(d["loss_mask"][:SEQ].sum()) for d in whole]
    assert sum(c == 0 for c in end_cut) == 45                 # MindFormers' end cut: the user's 45 empty rows
    ds = load_hf_dataset(long_file, cache_dir=os.path.join(os.path.dirname(long_file), "c"))
    report = sft_rows(ds, CHAIN[:2], tok, SEQ, source=long_file)          # packing off: one record per row
    assert (len(report.rows), report.records, report.cut, report.dropped) == (60, 60, 45, {})
    assert report.lines() == [f"{long_file}: 45 of 60 records cut to seq_length {SEQ} (prompt and earlier turns "
                              "first; each keeps its response's first tokens)"]
    for rec, row, doc in zip(recs, report.rows, whole):
        kept = row["labels"][row["loss_mask"] == 1]
        assert tok.decode(kept) == rec["output"] and kept[-1] == tok.eos_token_id      # the whole answer
        prompt = np.concatenate([doc["input_ids"][:1], doc["labels"]])[:int(np.argmax(doc["loss_mask"])) + 1]
        n = int(np.argmax(row["loss_mask"])) + 1                                        # prompt tokens kept
        got = row["input_ids"][:n]
        assert got[0] == tok.bos_token_id and (got[1:] == prompt[len(prompt) - (n - 1):]).all()   # its end, BOS
        if n < len(prompt):
            assert int((row["input_ids"] != tok.pad_token_id).sum()) == SEQ               # cut: the row is full
    empty = stack_samples([{k: d[k][:SEQ] for k in ("input_ids", "labels", "loss_mask")}
                           for d in (whole[1], whole[2])])
    fitted = stack_samples([{k: r[k] for k in ("input_ids", "labels", "loss_mask")} for r in report.rows[1:3]])
    m = _model(tok.vocab_size, SEQ)
    from mindspore import Tensor
    assert np.isnan(numpy_masked_mean(m, empty))             # 0/0: what the user's steps 2, 4, 6 computed
    want = numpy_masked_mean(m, fitted)
    got = float(m(*model_args(fitted, Tensor)).asnumpy())
    assert np.isfinite(want) and got == pytest.approx(want, rel=1e-5)


def _chat_file(tmp_path, convs, name="chat.jsonl"):
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.writelines(json.dumps({"messages": c}) + "\n" for c in convs)
    return path


def test_chat_drops_earlier_turns_and_keeps_the_last_answer(tok, tmp_path):
    conv = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is two plus two, counted slowly?"}, {"role": "assistant", "content": "four"},
            {"role": "user", "content": "And three plus three?"}, {"role": "assistant", "content": "six"},
            {"role": "user", "content": "And five plus five?"}, {"role": "assistant", "content": "ten"}]
    render = chat_renderer(tok.chat_template, tok, "test")
    turns = chat_turns({"messages": conv}, 0, tok, render, "messages", "test")
    sizes = [t.size for t in turns]
    budget = sum(sizes) - sizes[1] - sizes[2]                  # room for all but the first exchange
    path = _chat_file(tmp_path, [conv])
    ds = load_hf_dataset(path, cache_dir=str(tmp_path / "c"))
    report = sft_rows(ds, [{"type": "ChatTemplateDataHandler"}], tok, budget - 1, source=path)
    row = report.rows[0]
    text = tok.decode(row["input_ids"], skip_special_tokens=False)
    assert report.cut == 1 and "Be brief." in text and "two plus two" not in text and "five plus five" in text
    assert tok.decode(row["labels"][row["loss_mask"] == 1], skip_special_tokens=False) == "six</s>\nten</s>\n"
    # too short for the system turn and the last exchange: the prompt is cut, the last answer kept whole
    report = sft_rows(ds, [{"type": "ChatTemplateDataHandler"}], tok, sizes[-1] + 2, source=path)
    row = report.rows[0]
    assert tok.decode(row["labels"][row["loss_mask"] == 1], skip_special_tokens=False) == "ten</s>\n"
    assert row["input_ids"][0] == tok.bos_token_id


# ------------------------------------------------------------------------------------------------ dropped records
def test_records_without_a_target_are_dropped_counted_and_named(tok, tmp_path):
    answered = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]
    unanswered = [{"role": "user", "content": "Say nothing."}]
    path = _chat_file(tmp_path, [answered, unanswered, answered, unanswered, answered])
    ds = load_hf_dataset(path, cache_dir=str(tmp_path / "c"))
    report = sft_rows(ds, [{"type": "ChatTemplateDataHandler"}], tok, 64, source=path)
    assert len(report.rows) == 3 and report.dropped_count == 2
    assert report.lines() == [f"{path}: 2 of 5 records dropped: no target token within seq_length 64 (records 1, 3)"]
    assert all(r["loss_mask"].sum() > 0 for r in report.rows)
    # PackingHandler pack with a seq_length below the rows': records longer than it are skipped (MindFormers)
    alpaca = load_hf_dataset(ALPACA, cache_dir=str(tmp_path / "c"))
    lengths = [len(d["input_ids"]) for d in alpaca_documents(list(alpaca), tok)]
    limit = int(np.median(lengths))
    chain = [CHAIN[1], {"type": "PackingHandler", "seq_length": limit, "pack_strategy": "pack"}]
    report = sft_rows(alpaca, chain, tok, 256, source=ALPACA)
    too_long = [n for n, k in enumerate(lengths) if k > limit]
    assert 0 < len(too_long) < len(lengths) and max(lengths) <= 256
    assert report.dropped == {f"longer than PackingHandler seq_length {limit} (MindFormers' pack skips such "
                              "records)": too_long}
    assert sum(len(np.flatnonzero(r["position_ids"] == 0)) for r in report.rows) == len(lengths) - len(too_long)


def _config(tmp_path, data, *overrides, worker_num=1):
    from mindformers_core.training import load_config
    return load_config(YAML, [f"pretrained_model_dir={FOLDER}", f"load_checkpoint={FOLDER}",
                              f"train_dataset.data_loader.path={data}", f"output_dir={tmp_path / 'out'}",
                              "use_parallel=False", "parallel_config.data_parallel=1", "parallel_config.model_parallel=1",
                              "parallel_config.pipeline_stage=1", "model.model_config.compute_dtype=float32",
                              f"model.model_config.seq_length={SEQ}", "runner_config.batch_size=2",
                              "callbacks=[{type: MFLossMonitor}]", *overrides], worker_num=worker_num)


def test_dropped_records_are_reported_once_before_any_process_group(tok, tmp_path, capsys, monkeypatch):
    from mindformers_core.training import trainer as trainer_module
    answered = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]
    path = _chat_file(tmp_path, [answered, [{"role": "user", "content": "Say nothing."}], answered, answered])
    cfg = _config(tmp_path, path, "train_dataset.data_loader.handler=[{type: ChatTemplateDataHandler}]")

    def no_group(*a, **k):
        raise AssertionError("a process group was asked for")
    monkeypatch.setattr(trainer_module, "init_distributed", no_group)
    monkeypatch.setattr(trainer_module, "get_env", no_group)
    t = trainer_module.Trainer(cfg)
    out = capsys.readouterr().out
    line = (f"train_dataset.data_loader.path '{path}': 1 of 4 records dropped: no target token within seq_length "
            f"{SEQ} (records 1)")
    assert out.count(line) == 1, out
    assert len(t.sft.rows) == 3                                   # no PackingHandler: a row per kept record


def test_a_data_set_without_any_target_is_refused(tok, tmp_path, capsys):
    import run_mindformer
    path = _chat_file(tmp_path, [[{"role": "user", "content": f"Say {w}."}] for w in ("a", "b", "c")])
    ds = load_hf_dataset(path, cache_dir=str(tmp_path / "c"))
    with pytest.raises(NoTargetTokens, match=r"none of its 3 records keeps a target token \(3 no target token "
                                             r"within seq_length 64\)"):
        sft_rows(ds, [{"type": "ChatTemplateDataHandler"}], tok, 64, source=path)
    out = tmp_path / "out"
    code = run_mindformer.main(["--config", YAML, "--use_parallel", "False", "--pretrained_model_dir", FOLDER,
                                "--load_checkpoint", FOLDER, "--train_dataset.data_loader.path", path,
                                "--train_dataset.data_loader.handler", "[{type: ChatTemplateDataHandler}]",
                                "--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
                                "--model.model_config.compute_dtype", "float32", "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"train_dataset.data_loader.path '{path}': none of its 3 records keeps a target token" in err
    assert "Traceback" not in err and not os.path.exists(out / "loss.jsonl")


# ------------------------------------------------------------------------------------------------ empty batches
def _tiny_batch(rows=2, seq=32, vocab=320, seed=0):
    """Random ids and labels with a random 0/1 loss_mask (row 0 keeps some tokens)."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, seq)) > 0.5).astype(np.float32)
    mask[0, :4] = 1
    return {"input_ids": rng.integers(3, vocab, (rows, seq)).astype(np.int32),
            "labels": rng.integers(3, vocab, (rows, seq)).astype(np.int32), "loss_mask": mask}


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_a_mask_keeping_no_token_gives_loss_0_and_gradient_0(tok, mode):
    """The masked mean of a batch keeping no token is 0 with every gradient exactly 0 (was 0/0 = NaN); a batch
    keeping some is still NumPy's masked mean."""
    import mindspore as ms
    from mindspore import Tensor
    batch = _tiny_batch()
    m = _model(tok.vocab_size, 32)
    grad_fn = ms.value_and_grad(m, None, m.trainable_params())
    if mode == "jit":
        grad_fn = ms.jit(grad_fn)
    empty = dict(batch, loss_mask=np.zeros_like(batch["loss_mask"]))
    loss, grads = grad_fn(*model_args(empty, Tensor))
    assert float(loss.asnumpy()) == 0.0 and all(not np.any(g.asnumpy()) for g in grads)
    loss, grads = grad_fn(*model_args(batch, Tensor))
    assert float(loss.asnumpy()) == pytest.approx(numpy_masked_mean(m, batch), rel=1e-5)
    assert all(np.isfinite(g.asnumpy()).all() for g in grads) and any(np.any(g.asnumpy()) for g in grads)


def test_an_accumulation_micro_step_without_targets_is_weighted_0(tok):
    """gradient_accumulation_steps 2 where the second micro-step keeps no token: the step = one micro-step of
    both rows (the empty one weighs 0 and adds 0, not NaN)."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.training.steps import TokenWeights, plain_step_fn
    batch = _tiny_batch(seed=1)
    batch["loss_mask"][1] = 0
    m = _model(tok.vocab_size, 32)
    args = model_args(batch, Tensor)
    grad_fn = ms.value_and_grad(m, None, m.trainable_params())
    loss_w, grads_w = plain_step_fn(grad_fn, _sum(1), 1, False, model=m)(*args)
    loss_a, grads_a = plain_step_fn(grad_fn, _sum(2), 2, False, model=m, weights=TokenWeights(_OneRank()))(*args)
    assert np.isfinite(float(loss_a.asnumpy()))
    assert float(loss_a.asnumpy()) == pytest.approx(float(loss_w.asnumpy()), rel=1e-5)
    worst = max(float(np.abs(x.asnumpy() - y.asnumpy()).max() / (np.abs(y.asnumpy()).max() + 1e-12))
                for x, y in zip(grads_a, grads_w))
    assert worst < 1e-5, worst


def test_every_rank_counts_the_global_batch_targets_alike():
    """dp2, shuffled, across an epoch boundary: both ranks' ``global_targets`` of a step are the same number,
    the sum of the two ranks' local batches' kept tokens (no communication needed to agree on an empty step)."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(11):
        mask = (rng.random(8) > 0.5).astype(np.float32) * (i % 3 != 0)       # every third row keeps nothing
        rows.append({"input_ids": np.zeros(8, np.int32), "labels": np.zeros(8, np.int32), "loss_mask": mask})
    ranks = [SFTDataset(rows, ["input_ids", "labels", "loss_mask"], seed=5, shuffle=True, dp_rank=r, dp_size=2)
             for r in range(2)]
    streams = [iter(()) for _ in ranks]
    for step in range(7):                                               # 5 samples per epoch and rank
        starts = [d.consumed_samples for d in ranks]
        counts = [d.global_targets(s, 2) for d, s in zip(ranks, starts)]
        local = 0.0
        for i, d in enumerate(ranks):
            for _ in range(2):
                sample = next(streams[i], None)
                if sample is None:
                    streams[i] = iter(d)
                    sample = next(streams[i])
                local += float(sample["loss_mask"].sum())
        assert counts[0] == counts[1] == local, (step, counts, local)
    # a global batch of rows keeping nothing: 0 on both ranks
    zero = [dict(r, loss_mask=np.zeros(8, np.float32)) for r in rows]
    assert all(SFTDataset(zero, seed=5, dp_rank=r, dp_size=2).global_targets(0, 2) == 0 for r in range(2))


def _state(trainer):
    """Weights, both AdamW moments and the optimizer's step, as NumPy."""
    opt = trainer.optimizer
    return ([p.asnumpy().copy() for p in trainer.params] + [p.asnumpy().copy() for p in opt.moment1]
            + [p.asnumpy().copy() for p in opt.moment2] + [opt.global_step.asnumpy().copy()])


@pytest.mark.parametrize("mode", [1, 0], ids=["pynative", "jit"])
def test_a_global_batch_without_targets_is_logged_not_a_fault(tmp_path, long_file, capsys, mode):
    """The real YAML (one process, batch 2) with step 2's two rows holding no target token: step 2 is logged
    with loss 0 and no_target, nothing runs (weights and AdamW moments as after step 1), the guard does not
    count it (max_consecutive_skipped_steps 1 would stop the run), and step 3 trains."""
    from mindformers_core.training.trainer import Trainer
    cfg = _config(tmp_path, long_file, f"context.mode={mode}", "runner_config.max_steps=3",
                  "runner_config.max_consecutive_skipped_steps=1", "lr_schedule.learning_rate=1e-2",
                  "train_dataset.data_loader.handler=[{type: AlpacaInstructDataHandler}]")
    t = Trainer(cfg)
    t.setup()
    for index in t.inputs.data.epoch_indices(0)[2:4]:
        t.inputs.data.rows[int(index)]["loss_mask"][:] = 0
    states, step_fn = [], t.step_fn

    def recorded(*batch):
        states.append(("before", _state(t)))
        out = step_fn(*batch)
        states.append(("after", _state(t)))
        return out
    t.step_fn = recorded
    history = t.train()
    assert [s for s, _ in states] == ["before", "after", "before", "after"]     # steps 1 and 3 ran, 2 did not
    after_1, before_3 = states[1][1], states[2][1]
    assert all(np.array_equal(a, b) for a, b in zip(after_1, before_3))
    assert int(before_3[-1]) == 1
    assert [r.get("no_target", False) for r in history] == [False, True, False]
    assert history[1]["loss"] == 0.0 and not any(r.get("skipped") for r in history)
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in (history[0], history[2]))
    assert int(t.optimizer.global_step.asnumpy()) == 2
    assert "no target token in the global batch: no update (not a fault)" in capsys.readouterr().out
    assert [r.get("no_target", False) for r in logged(tmp_path / "out")] == [False, True, False]


def test_the_real_finetune_yaml_at_seq_128_on_long_records_has_every_step_finite(tmp_path, long_file, capsys):
    """The user's run: MindFormers' finetune_qwen3.yaml as it is (jit, its handler chain) with paths and sizes
    overridden, seq_length 128, batch 2, lr 1e-2, 6 steps, on the 60 long records: before, steps 2, 4, 6 were
    NaN and skipped as faults; now every step's loss is finite and every step updates."""
    import run_mindformer
    out = tmp_path / "run"
    code = run_mindformer.main(["--config", YAML, "--use_parallel", "False", "--pretrained_model_dir", FOLDER,
                                "--load_checkpoint", FOLDER, "--train_dataset.data_loader.path", long_file,
                                "--output_dir", str(out), "--parallel_config.data_parallel", "1",
                                "--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
                                "--model.model_config.compute_dtype", "float32", "--model.model_config.seq_length",
                                str(SEQ), "--runner_config.batch_size", "2", "--runner_config.max_steps", "6",
                                "--lr_schedule.learning_rate", "1e-2", "--callbacks", "[{type: MFLossMonitor}]"])
    printed = capsys.readouterr().out
    assert code == 0
    steps = logged(out)
    assert len(steps) == 6 and all(r["loss"] is not None and np.isfinite(r["loss"]) for r in steps), steps
    assert not any(r.get("skipped") or r.get("no_target") for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert f"45 of 60 records cut to seq_length {SEQ}" in printed
