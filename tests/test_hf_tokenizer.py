"""The Hugging Face tokenizer (data.tokenizer.HFTokenizer, kind "hf") against the ids that `tokenizers`
and `transformers` stored in tests/data/hf/*/reference.npz, and the fixture folders themselves: complete,
readable without torch, and small."""
import json
import os
import shutil

import numpy as np
import pytest

from mindformers_core.data.tokenizer import HFTokenizer, LlamaTokenizer, as_tokenizer, build_tokenizer

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
FOLDERS = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_moe_sharded", "llama_bf16")
REFERENCE_KEYS = {"input_ids", "logits", "prompt_0", "prompt_1", "prompt_2", "generated_0", "generated_1",
                  "generated_2", "sentence", "sentence_ids", "sentence_ids_with_special"}


def reference(name):
    with np.load(os.path.join(HF, name, "reference.npz")) as ref:
        return {k: ref[k] for k in ref.files}


@pytest.mark.parametrize("name", FOLDERS)
def test_ids_equal_the_stored_ids(name):
    ref = reference(name)
    tok = HFTokenizer.from_folder(os.path.join(HF, name))
    sentence = str(ref["sentence"])
    assert tok.encode(sentence, add_bos=False) == ref["sentence_ids"].tolist()
    assert tok.encode(sentence) == ref["sentence_ids_with_special"].tolist()      # the post-processor's <s>
    assert tok.encode([sentence, sentence], add_bos=False) == [ref["sentence_ids"].tolist()] * 2
    for i in range(3):                      # the generation prompts are <s> + the start of the sentence
        prompt = ref[f"prompt_{i}"].tolist()
        assert prompt == tok.encode(sentence)[:len(prompt)]


def test_decode_round_trip_and_special_ids():
    tok = build_tokenizer("hf", os.path.join(HF, "qwen3"))
    assert (tok.vocab_size, tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (320, 0, 1, 2)
    assert tok.eos_token_ids == (2,) and tok.unk_token_id is None and tok.all_special_ids == [0, 1, 2]
    assert tok.vocab_file == os.path.join(HF, "qwen3", "tokenizer.json")
    for text in ("Return the number of items.", "  two  spaces, tabs\tand\nnew lines ", "Ünïcödé ✓ 漢字"):
        ids = tok.encode(text, add_bos=True, add_eos=True)
        assert ids[0] == 1 and ids[-1] == 2 and max(ids) < tok.vocab_size
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special_tokens=False) == f"<s>{text}</s>"
    assert "".join(tok.tokenize("hello world")).replace("Ġ", " ") == "hello world"
    assert tok.convert_tokens_to_ids(["<pad>", "<s>", "</s>"]) == [0, 1, 2]
    batch = tok.batch_encode(["a b", "hello there, world"], max_length=6, add_eos=True)
    assert batch["input_ids"].shape == (2, 6) and batch["input_ids"].dtype == np.int32
    assert batch["attention_mask"][0].tolist() == [1] * len(tok.encode("a b", add_eos=True)) + [0] * 2
    assert (batch["input_ids"][0][batch["attention_mask"][0] == 0] == 0).all()
    assert tok.chat_template.startswith("{{ bos_token }}")
    # the same file given as tokenizer.json reads the special tokens next to it
    assert build_tokenizer("hf", tok.vocab_file).eos_token_id == 2
    assert isinstance(as_tokenizer(os.path.join(HF, "llama")), HFTokenizer)


def test_special_tokens_from_each_source(tmp_path):
    """tokenizer_config.json first, then special_tokens_map.json ({"content": ...} form), then
    generation_config.json (an eos list); no bos given: None and nothing added; no pad: the eos id."""
    shutil.copy(os.path.join(HF, "qwen3", "tokenizer.json"), tmp_path)
    tok = HFTokenizer(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (None, None, 0)
    assert tok.encode("ab", add_bos=True, add_eos=True) == tok.encode("ab", add_bos=False)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1], "pad_token_id": None}))
    tok = HFTokenizer(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id) == (None, 2, (2, 1), 2)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": {"content": "<s>", "lstrip": False}, "pad_token": "</s>"}))
    tok = HFTokenizer(tmp_path)
    assert (tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id) == (1, (1, 2), 2)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    tok = HFTokenizer(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.chat_template is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: eos_token = '<\|im_end\|>' is not in the vocab"):
        HFTokenizer(tmp_path)


def test_folder_without_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"no tokenizer.json in '{tmp_path}'.*'llama' tokenizer kind"):
        HFTokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x03abc")
    with pytest.raises(FileNotFoundError, match=r"it has a SentencePiece tokenizer.model: read it with the 'llama'"):
        build_tokenizer("hf", tmp_path)
    with pytest.raises(ValueError, match=r"tokenizer.model: not a Hugging Face tokenizer.json .*'llama' tokenizer"):
        HFTokenizer(tmp_path / "tokenizer.model")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        HFTokenizer.from_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"tokenizer kind 'gpt2': not known; known: \['hf', 'llama'"):
        build_tokenizer("gpt2", tmp_path)


def test_packed_dataset_reads_text_with_it(tmp_path):
    """The pretraining text path: PackedDataset and its token cache take an HF tokenizer (object or
    folder path): documents become <s> ids </s>."""
    from mindformers_core.data.dataset import PackedDataset, cache_file_for
    data = tmp_path / "docs.txt"
    data.write_text("Return the number of items.\nA second document, longer than the first one.\n")
    tok = HFTokenizer.from_folder(os.path.join(HF, "llama"))
    ds = PackedDataset(str(data), os.path.join(HF, "llama"), seq_length=8, cache_dir=str(tmp_path / "c"),
                       shuffle=False)
    stream = [tok.encode(line, add_bos=True, add_eos=True) for line in data.read_text().splitlines()]
    assert ds.tokens.tolist() == sum(stream, [])
    ids, labels = next(iter(ds))
    assert ids.tolist() == sum(stream, [])[:8] and labels.tolist() == sum(stream, [])[1:9]
    # the cache name depends on the HF tokenizer's bos/eos, not only on tokenizer.json
    assert not isinstance(tok, LlamaTokenizer) and tok.cache_key == "hf|bos=1|eos=2"
    assert cache_file_for([str(data)], tok, "c") != cache_file_for([str(data)], _NoKey(tok), "c")


class _NoKey:
    def __init__(self, tok):
        self.vocab_file = tok.vocab_file


@pytest.mark.parametrize("name", FOLDERS)
def test_fixture_folder_is_complete_and_small(name):
    folder = os.path.join(HF, name)
    files = set(os.listdir(folder))
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "reference.npz"} <= files
    if "model.safetensors.index.json" in files:
        with open(os.path.join(folder, "model.safetensors.index.json"), encoding="utf-8") as f:
            shards = set(json.load(f)["weight_map"].values())
        assert len(shards) >= 3 and shards <= files and "model.safetensors" not in files
    else:
        assert "model.safetensors" in files
    assert sum(os.path.getsize(os.path.join(folder, f)) for f in files) < 1_000_000
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["vocab_size"] == 320 and config["max_position_embeddings"] == 64
    assert config["dtype"] == ("bfloat16" if name.endswith("bf16") else "float32")
    ref = reference(name)
    assert set(ref) == REFERENCE_KEYS
    assert ref["input_ids"].shape == (2, 16) and ref["logits"].shape == (2, 16, 320)
    assert ref["logits"].dtype == np.float32 and np.isfinite(ref["logits"]).all()
    assert [len(ref[f"prompt_{i}"]) for i in range(3)] == [5, 9, 12]
    for i in range(3):
        prompt, generated = ref[f"prompt_{i}"], ref[f"generated_{i}"]
        assert (generated[:len(prompt)] == prompt).all() and len(prompt) < len(generated) <= len(prompt) + 32
        assert len(generated) == len(prompt) + 32 or generated[-1] == 2      # stops only at eos


def test_variants_share_their_source_references():
    moe, sharded = reference("qwen3_moe"), reference("qwen3_moe_sharded")
    assert all(np.array_equal(moe[k], sharded[k]) for k in REFERENCE_KEYS)
    llama, bf16 = reference("llama"), reference("llama_bf16")
    assert np.array_equal(llama["input_ids"], bf16["input_ids"])
    assert 0 < np.abs(llama["logits"] - bf16["logits"]).max() < 0.05 * np.abs(llama["logits"]).max()   # bf16 weights
