"""Megatron-style indexed datasets (.bin/.idx): the format byte by byte, the reader, blending, the
preprocessing script, and the trainer reading them from MindFormers' BlendedMegatronDatasetDataLoader
section — the tokens fed in 3 steps are the corpus' tokens, and the losses equal a run on the text."""
import importlib.util
import json
import os
import struct

import numpy as np
import pytest
import yaml

from mindformers_core.data.dataset import read_documents
from mindformers_core.data.megatron import (IndexedDataset, MegatronDataset, blend_indices, parse_data_path,
                                            write_indexed_dataset)
from mindformers_core.data.tokenizer import LlamaTokenizer
from mindformers_core.training import load_config
from mindformers_core.training.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def test_index_file_layout_byte_by_byte(tmp_path):
    docs = [[5, 6, 7], [], [8, 9]]
    prefix = str(tmp_path / "d")
    assert write_indexed_dataset(prefix, docs, np.uint16) == (3, 5)
    raw = open(prefix + ".idx", "rb").read()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, seqs, doc_count = struct.unpack("<QBQQ", raw[9:34])
    assert (version, code, seqs, doc_count) == (1, 8, 3, 4)                 # 8 = uint16
    rest = raw[34:]
    assert list(np.frombuffer(rest[:12], "<i4")) == [3, 0, 2]               # lengths
    assert list(np.frombuffer(rest[12:36], "<i8")) == [0, 6, 6]             # byte offsets into .bin
    assert list(np.frombuffer(rest[36:68], "<i8")) == [0, 1, 2, 3]          # document boundaries
    assert len(rest) == 68
    assert list(np.fromfile(prefix + ".bin", "<u2")) == [5, 6, 7, 8, 9]
    ds = IndexedDataset(prefix)
    assert len(ds) == 3 and list(ds[0]) == [5, 6, 7] and list(ds[1]) == [] and list(ds[2]) == [8, 9]
    assert list(ds.stream()) == [5, 6, 7, 8, 9] and ds.dtype == np.uint16


def test_reader_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"x\.idx: no such file"):
        IndexedDataset(str(tmp_path / "x"))
    (tmp_path / "y.bin").write_bytes(b"")
    (tmp_path / "y.idx").write_bytes(b"NOTANIDX" + bytes(40))
    with pytest.raises(ValueError, match=r"y\.idx: not a Megatron index file"):
        IndexedDataset(str(tmp_path / "y"))
    prefix = str(tmp_path / "z")
    write_indexed_dataset(prefix, [[1, 2, 3, 4]], np.int32)
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(8)
    with pytest.raises(ValueError, match=r"z\.bin: shorter"):
        IndexedDataset(prefix)
    with pytest.raises(ValueError, match="do not fit"):
        write_indexed_dataset(str(tmp_path / "w"), [[70000]], np.uint16)


def test_data_path_forms_and_blending():
    assert parse_data_path("/a/b") == [(1.0, "/a/b")]
    assert parse_data_path(["1", "/a", "0.5", "/b"]) == [(1.0, "/a"), (0.5, "/b")]
    assert parse_data_path(["/a", "/b"]) == [(1.0, "/a"), (1.0, "/b")]
    for bad in ([], ["1", "/a", "2"], ["0", "/a"]):
        with pytest.raises(ValueError):
            parse_data_path(bad)
    which, index = blend_indices([3, 1], [30, 10])
    assert np.bincount(which).tolist() == [30, 10]
    assert np.bincount(which[:8]).tolist() == [6, 2]                       # in proportion all along
    assert index[which == 0].tolist() == list(range(30))


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    """The tiny corpus/tokenizer of tests/test_trainer.py, preprocessed by scripts/preprocess_megatron.py."""
    from tests.test_trainer import build_assets
    tiny = build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))
    spec = importlib.util.spec_from_file_location("preprocess_megatron",
                                                  os.path.join(ROOT, "scripts", "preprocess_megatron.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path_factory.mktemp("megatron")
    jsonl = out / "corpus.jsonl"
    with open(jsonl, "w") as f:
        for doc in read_documents(tiny["corpus"]):
            f.write(json.dumps({"text": doc}) + "\n")
    prefix = script.main(["--input", str(jsonl), "--tokenizer-model", tiny["tokenizer"],
                          "--output-prefix", str(out / "wiki")])
    assert prefix == str(out / "wiki_text_document")
    tok = LlamaTokenizer(tiny["tokenizer"])
    stream = np.concatenate([np.asarray(ids) for ids in tok.encode(list(read_documents(tiny["corpus"])),
                                                                   add_bos=True, add_eos=True)])
    return dict(tiny, prefix=prefix, stream=stream)


def graph_yaml(tmp_path, megatron, shuffle):
    """A graph-mode file writing its data section as MindFormers' Megatron configs do."""
    raw = yaml.safe_load(open(megatron["yaml"]))
    raw["train_dataset"] = {
        "data_loader": {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
                        "sizes": [8000, 0, 0], "shuffle": shuffle,
                        "config": {"seed": 1234, "split": "1, 0, 0", "seq_length": 32, "eod": 2, "pad": -1,
                                   "data_path": ["1", megatron["prefix"]]}},
        "input_columns": ["input_ids", "labels", "loss_mask", "position_ids"], "num_parallel_workers": 8,
        "tokenizer_file": megatron["tokenizer"]}
    raw["runner_config"]["max_steps"] = STEPS
    raw["callbacks"] = [{"type": "MFLossMonitor"}]
    path = tmp_path / f"megatron_{shuffle}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def train(config, out):
    trainer = Trainer(load_config(config, ["--output_dir", str(out)]))
    trainer.setup()
    fed, step = [], trainer.step_fn

    def recording(ids, labels):
        fed.append((ids.asnumpy().copy(), labels.asnumpy().copy()))
        return step(ids, labels)

    trainer.step_fn = recording
    history = trainer.train()
    return fed, [r["loss"] for r in history]


def test_trainer_reads_megatron_data_tokens_equal_the_corpus(megatron, tmp_path):
    fed, losses = train(graph_yaml(tmp_path, megatron, False), tmp_path / "out")
    assert len(fed) == STEPS and all(np.isfinite(losses))
    stream, seq = megatron["stream"], 32
    ids = np.concatenate([f[0] for f in fed])                 # rows in order: unshuffled windows
    for row, window in enumerate(ids):
        assert window.tolist() == stream[row * seq:row * seq + seq].tolist()
    labels = np.concatenate([f[1] for f in fed])
    assert labels[:, :-1].tolist() == ids[:, 1:].tolist() and labels[-1, -1] == stream[len(ids) * seq]


def test_megatron_run_equals_the_text_run(megatron, tmp_path):
    """Shuffled, the same seed: the same samples in the same order as the text loader, so the same losses."""
    fed, losses = train(graph_yaml(tmp_path, megatron, True), tmp_path / "m")
    text_fed, text_losses = train(megatron["yaml"], tmp_path / "t")
    assert all((a[0] == b[0]).all() for a, b in zip(fed, text_fed[:STEPS]))
    assert losses == text_losses[:STEPS]


def test_megatron_config_errors_are_named(megatron, tmp_path, capsys):
    from mindformers_core.training import cli
    path = graph_yaml(tmp_path, megatron, False)
    code = cli.main(["--config", path, "--check_config", "--output_dir", str(tmp_path / "e"),
                     "--train_dataset.data_loader.config.data_path", f"['1', '{tmp_path}/nope']"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"train_dataset.data_loader.config.data_path = ['1', '{tmp_path}/nope']: {tmp_path}/nope.idx: " \
           "no such file" in err, err
    code = cli.main(["--config", path, "--check_config", "--output_dir", str(tmp_path / "e"),
                     "--train_dataset.tokenizer_file", "null"])
    assert code == 2 and "needs train_dataset.tokenizer_file" in capsys.readouterr().err
    ds = MegatronDataset(megatron["prefix"], 32, shuffle=False)
    assert ds.sample(0)[0].tolist() == megatron["stream"][:32].tolist()
    with pytest.raises(ValueError, match="token id .* >= vocab_size 100"):
        MegatronDataset(megatron["prefix"], 32, vocab_size=100)
