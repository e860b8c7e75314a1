"""Data pipeline: corpus determinism, tokenizer, packing, dp slicing, resume, GeneratorDataset, errors."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindformers_core.data import (LlamaTokenizer, PackedDataset, build_corpus, create_dataset,
                                   train_tokenizer)

SEQ = 16


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    corpus = build_corpus(str(root / "corpus.txt"), max_bytes=40_000)
    model = train_tokenizer([corpus], str(root / "tok"), vocab_size=384)
    return root, corpus, LlamaTokenizer(model)


def make(work, **kw):
    root, corpus, tok = work
    kw.setdefault("seq_length", SEQ)
    return PackedDataset(corpus, tok, cache_dir=str(root / "cache"), seed=3, **kw)


def test_corpus_deterministic_and_capped(work, tmp_path):
    root, corpus, _ = work
    data = open(corpus, "rb").read()
    assert 30_000 < len(data) <= 40_000 and data.endswith(b"\n")
    assert all(line.strip() and "  " not in line for line in data.decode().splitlines())
    # a fresh interpreter with another hash seed writes the same bytes
    code = ("import sys; from mindformers_core.data.corpus import build_corpus; "
            "build_corpus(sys.argv[1], max_bytes=40_000)")
    env = {"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.txt")], check=True, env=env)
    assert (tmp_path / "c.txt").read_bytes() == data


def test_tokenizer_training_deterministic(work, tmp_path):
    root, corpus, tok = work
    again = train_tokenizer(corpus, str(tmp_path / "tok"), vocab_size=384)
    # the .model embeds its own path (trainer_spec), so compare the learned pieces and scores
    assert open(again[:-6] + ".vocab", "rb").read() == open(tok.vocab_file[:-6] + ".vocab", "rb").read()


def test_special_ids_and_round_trip(work):
    tok = work[2]
    assert (tok.vocab_size, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == \
        (384, 0, 1, 2, 0)
    text = "Return the  number 12345 of items.\nÜnïcode ✓ 中文"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and 0 not in ids  # byte fallback: never <unk>
    assert tok.encode(text, add_bos=False) == ids[1:-1]
    assert tok.decode(ids) == text
    batch = tok.batch_encode(["abc", text], max_length=12)
    assert batch["input_ids"].shape == (2, 12) and batch["input_ids"].dtype == np.int32
    n = len(tok.encode("abc"))
    assert batch["attention_mask"][0].tolist() == [1] * n + [0] * (12 - n)
    assert (batch["input_ids"][0, n:] == tok.pad_token_id).all()
    assert tok.decode(batch["input_ids"][0]) == "abc"
    left = tok.batch_encode(["abc"], max_length=12, padding_side="left")["input_ids"][0]
    assert left[-n:].tolist() == tok.encode("abc")


def test_packing_labels_shifted(work):
    ds = make(work, shuffle=False)
    tokens = np.asarray(ds.tokens)
    assert ds.num_samples == (len(tokens) - 1) // SEQ
    samples = list(ds)
    assert len(samples) == ds.num_samples
    for i, (ids, labels) in enumerate(samples):
        assert ids.shape == labels.shape == (SEQ,)
        assert (ids[1:] == labels[:-1]).all()
        assert (ids == tokens[i * SEQ:(i + 1) * SEQ]).all() and labels[-1] == tokens[(i + 1) * SEQ]
    # documents are framed by BOS ... EOS, and EOS is followed by the next BOS
    assert tokens[0] == 1 and (tokens[np.flatnonzero(tokens[:-1] == 2) + 1] == 1).all()


def test_order_deterministic_and_seeded(work):
    first = [ids.tolist() for ids, _ in make(work)]
    assert first == [ids.tolist() for ids, _ in make(work)]
    other = PackedDataset(work[1], work[2], SEQ, cache_dir=str(work[0] / "cache"), seed=4)
    assert first != [ids.tolist() for ids, _ in other]


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_dp_slices_disjoint_and_covering(work, drop_remainder):
    dp = 3
    ranks = [make(work, dp_rank=r, dp_size=dp, drop_remainder=drop_remainder) for r in range(dp)]
    seen = [list(r.epoch_indices(0)) for r in ranks]
    flat = sum(seen, [])
    assert len(flat) == len(set(flat))  # disjoint
    n = ranks[0].num_samples
    if drop_remainder:
        assert {len(s) for s in seen} == {n // dp} and len(flat) == n - n % dp
    else:
        assert sorted(flat) == list(range(n))  # covering
    # step k across ranks == a single process reading dp*k .. dp*(k+1)
    single = list(make(work).epoch_indices(0))
    assert [seen[r][k] for k in range(len(seen[2])) for r in range(dp)] == single[:dp * len(seen[2])]


def test_resume_equals_uninterrupted(work):
    full = make(work)
    per = full.samples_per_epoch
    stream = [ids for _ in range(2) for ids, _ in full]  # two epochs
    part = make(work)
    it = iter(part)
    head = [next(it)[0] for _ in range(per - 5)]
    state = json.loads(json.dumps(part.state_dict()))  # the state survives a checkpoint as JSON
    resumed = make(work)
    resumed.load_state_dict(state)
    tail = [ids for ids, _ in resumed] + [ids for ids, _ in resumed]  # rest of epoch 0, then epoch 1
    assert len(head) + len(tail) == len(stream)
    assert all((a == b).all() for a, b in zip(head + tail, stream))
    with pytest.raises(ValueError, match="seed"):
        make(work, dp_size=1).load_state_dict({**state, "seed": 99})


def test_generator_dataset_same_batches_and_resume(work):
    batch = 4
    reference = make(work)
    samples = [ids for ids, _ in reference]
    got = [b for b in create_dataset(make(work), batch).create_dict_iterator(output_numpy=True, num_epochs=1)]
    assert len(got) == len(samples) // batch
    for k, b in enumerate(got):
        assert b["input_ids"].shape == (batch, SEQ) and b["input_ids"].dtype == np.int32
        assert (b["input_ids"] == np.stack(samples[k * batch:(k + 1) * batch])).all()
        assert (b["input_ids"][:, 1:] == b["labels"][:, :-1]).all()
    # stop after 3 steps (the pipeline has prefetched further), resume from the trainer's count
    source = make(work)
    it = create_dataset(source, batch).create_tuple_iterator(output_numpy=True, num_epochs=1)
    for _ in range(3):
        next(it)
    state = source.state_dict(consumed_samples=3 * batch)
    resumed = make(work)
    resumed.load_state_dict(state)
    rest = list(create_dataset(resumed, batch).create_tuple_iterator(output_numpy=True, num_epochs=1))
    assert len(rest) == len(got) - 3
    assert all((a[0] == b["input_ids"]).all() for a, b in zip(rest, got[3:]))


def test_errors_name_argument(work, tmp_path):
    root, corpus, tok = work
    with pytest.raises(FileNotFoundError, match="data_files.*nope.txt"):
        PackedDataset(str(tmp_path / "nope.txt"), tok, SEQ)
    with pytest.raises(FileNotFoundError, match="text_files.*nope.txt"):
        train_tokenizer([str(tmp_path / "nope.txt")], str(tmp_path / "t"), 384)
    with pytest.raises(FileNotFoundError, match="vocab_file"):
        LlamaTokenizer(str(tmp_path / "missing.model"))
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"content": f"document number {i}"}) for i in range(20)) + "\n")
    with pytest.raises(KeyError, match=r"text_key='text'.*d.jsonl:1.*content"):
        PackedDataset(str(jsonl), tok, SEQ, cache_dir=str(tmp_path / "c"))
    ds = PackedDataset(str(jsonl), tok, SEQ, cache_dir=str(tmp_path / "c"), text_key="content")
    assert tok.decode(np.asarray(ds.tokens)).startswith("document number 0")
    with pytest.raises(ValueError, match="seq_length=100000 too large"):
        PackedDataset(str(jsonl), tok, 100_000, cache_dir=str(tmp_path / "c"), text_key="content")
    with pytest.raises(ValueError, match="dp_rank=2, dp_size=2"):
        make(work, dp_rank=2, dp_size=2)
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer([corpus], str(tmp_path / "t"), 100)


def test_cache_reused(work):
    a, b = make(work), make(work)
    assert a.cache_path == b.cache_path and a.tokens.dtype == np.uint16
