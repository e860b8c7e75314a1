"""Hugging Face model folders as data (models/hf/folder.py), our weights exported as one (export.py) and
read back by slice onto a layout (loader.py). One process, synthetic folders written here; the fixture
folders made by transformers are tested in tests/test_hf_models.py."""
import json
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import LlamaConfig, LlamaForCausalLM
from mindformers_core.models.hf.export import export_folder, shard_plan
from mindformers_core.models.hf.folder import FolderError, open_folder
from mindformers_core.models.hf.loader import load_hf_weights, unused_tensors
from mindformers_core.models.llama.hf import LLAMA_HF
from mindformers_core.models.state_dict import StackedRule, StateDictAdapter
from mindformers_core.sharding.layout import Layout

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32}


def tiny_state(seed=0):
    ms.set_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                                         vocab_size=64, seq_length=8, ffn_hidden_size=48))
    return {p.name: p.asnumpy() for p in model.trainable_params()}


@pytest.fixture
def exported(tmp_path):
    state = tiny_state()
    path = export_folder(str(tmp_path / "hf"), state, LLAMA_HF, CONFIG, max_shard_bytes=8000)
    return state, path


def test_export_writes_shards_index_and_config_and_reads_back_bitwise(exported):
    state, path = exported
    names = sorted(os.listdir(path))
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) >= 3 and "model.safetensors.index.json" in names and "config.json" in names
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".hf.")]      # no staging left
    folder = open_folder(path)
    assert folder.config == CONFIG and len(folder.files) == len(shards)
    assert "lm_head.weight" in folder.tensors and folder.tensors["lm_head.weight"].shape == (64, 32)  # (out, in)
    back = load_hf_weights(folder, LLAMA_HF, {n: a.shape for n, a in state.items()})
    assert sorted(back) == sorted(state)
    for name, array in state.items():
        assert back[name].dtype == array.dtype and np.array_equal(back[name], array), name
    assert unused_tensors(folder, LLAMA_HF, list(state)) == []
    assert unused_tensors(folder, LLAMA_HF, [n for n in state if "layers.1." not in n])   # layer 1 left out


def test_each_rank_reads_its_region_of_a_tp_layout(exported):
    state, path = exported
    folder = open_folder(path)
    mesh = Layout((2, 2), ("dp", "tp"))
    name = "decoder.layers.1.self_attention.linear_q.weight"          # (in 32, out 32) column-parallel
    targets = {name: (state[name].shape, mesh("None", "tp")),
               "output_layer.weight": (state["output_layer.weight"].shape, mesh("None", "tp")),
               "decoder.layers.0.mlp.linear_fc2.weight": (state["decoder.layers.0.mlp.linear_fc2.weight"].shape,
                                                           mesh("tp", "None"))}
    for rank in range(4):
        got = load_hf_weights(folder, LLAMA_HF, targets, rank)
        for n, (shape, layout) in targets.items():
            np.testing.assert_array_equal(got[n], state[n][layout.local_slice(shape, rank)])
            assert got[n].shape == layout.local_shape(shape)


def test_bf16_cast_on_export_and_to_float32_on_load(tmp_path):
    state = tiny_state()
    path = export_folder(str(tmp_path / "bf16"), state, LLAMA_HF, CONFIG, dtype="bfloat16")
    folder = open_folder(path)
    assert {t.dtype for t in folder.tensors.values()} == {"BF16"}
    back = load_hf_weights(folder, LLAMA_HF, {n: a.shape for n, a in state.items()}, dtype="float32")
    for name, array in state.items():
        assert back[name].dtype == np.float32
        np.testing.assert_allclose(back[name], array, rtol=2 ** -8, atol=1e-30)


def test_stacked_expert_rule_reads_only_the_rank_experts(tmp_path):
    rule = StackedRule("decoder.layers.{i}.mlp.experts.w_gate", "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
                       transpose=True)
    adapter = StateDictAdapter([rule])
    ours = np.random.RandomState(0).rand(4, 6, 10).astype(np.float32)        # (E, h, f)
    name = "decoder.layers.3.mlp.experts.w_gate"
    hf = adapter.to_hf({name: ours})
    assert sorted(hf) == [f"model.layers.3.mlp.experts.{e}.gate_proj.weight" for e in range(4)]
    assert hf["model.layers.3.mlp.experts.2.gate_proj.weight"].shape == (10, 6)
    path = export_folder(str(tmp_path / "moe"), {name: ours}, adapter, {"model_type": "x"})
    folder = open_folder(path)
    ep = Layout((2,), ("ep",))
    reads = []
    with folder.reader() as read:
        def counting(hf_name, slices):
            reads.append(hf_name)
            return read(hf_name, slices)
        part = adapter.read(name, ours.shape, ((2, 4), (0, 6), (0, 10)), counting)
    np.testing.assert_array_equal(part, ours[2:4])
    assert reads == ["model.layers.3.mlp.experts.2.gate_proj.weight", "model.layers.3.mlp.experts.3.gate_proj.weight"]
    got = load_hf_weights(folder, adapter, {name: (ours.shape, ep("ep", "None", "None"))}, rank=1)
    np.testing.assert_array_equal(got[name], ours[2:])
    assert adapter.from_hf(hf)[name].tolist() == ours.tolist()


def test_shard_plan_keeps_order_and_limit():
    arrays = {f"t{i}": np.zeros(n, np.float32) for i, n in enumerate([10, 10, 30, 5, 5])}
    assert shard_plan(arrays, 80) == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert shard_plan(arrays, 10 ** 9) == [list(arrays)]


def _folder(tmp_path, state=None, **kw):
    state = tiny_state() if state is None else state
    return state, export_folder(str(tmp_path / kw.pop("name", "m")), state, LLAMA_HF, CONFIG, **kw)


def _break_missing_config(path):
    os.remove(os.path.join(path, "config.json"))


def _break_bad_json(path):
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"hidden_size": 32,')


def _break_missing_shard(path):
    os.remove(os.path.join(path, "model-00002-of-00005.safetensors"))


def _break_truncated(path):
    p = os.path.join(path, "model-00003-of-00005.safetensors")
    with open(p, "rb+") as f:
        f.truncate(os.path.getsize(p) - 100)


def _break_index_outside(path):
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = "../elsewhere/model.safetensors"
    json.dump(data, open(index, "w"))


def _break_index_absolute(path):
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    data["weight_map"][next(iter(data["weight_map"]))] = "/etc/passwd"
    json.dump(data, open(index, "w"))


def _break_only_pickle(path):
    for n in os.listdir(path):
        if n.endswith(".safetensors") or n.endswith(".index.json"):
            os.remove(os.path.join(path, n))
    open(os.path.join(path, "pytorch_model.bin"), "wb").write(b"\x80\x04not really a pickle")


def _break_shards_without_index(path):
    os.remove(os.path.join(path, "model.safetensors.index.json"))


def _break_index_wrong_file(path):
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    data["weight_map"]["model.norm.weight"] = "model-00001-of-00005.safetensors"
    json.dump(data, open(index, "w"))


BROKEN = [
    (_break_missing_config, "no config.json"),
    (_break_bad_json, "config.json is not valid JSON (line 1"),
    (_break_missing_shard, "'model-00002-of-00005.safetensors', which is missing"),
    (_break_truncated, "the file is truncated"),
    (_break_index_outside, "'../elsewhere/model.safetensors', which is outside the folder"),
    (_break_index_absolute, "'/etc/passwd', which is outside the folder"),
    (_break_only_pickle, "only pickled PyTorch weights (pytorch_model.bin)"),
    (_break_shards_without_index, "without model.safetensors.index.json"),
    (_break_index_wrong_file, "puts tensor 'model.norm.weight' in model-00001-of-00005.safetensors, which does not"),
]


@pytest.mark.parametrize("breaker, words", BROKEN, ids=[b.__name__[7:] for b, _ in BROKEN])
def test_broken_folders_are_named(tmp_path, breaker, words):
    _, path = _folder(tmp_path, max_shard_bytes=20000)
    assert len([n for n in os.listdir(path) if n.startswith("model-")]) == 5
    breaker(path)
    with pytest.raises(FolderError) as err:
        open_folder(path)
    assert words in str(err.value) and path in str(err.value)


def test_no_directory_and_a_hub_name_say_download_first(tmp_path):
    with pytest.raises(FolderError, match="downloaded first"):
        open_folder("Qwen/Qwen3-0.6B")


def test_wrong_shapes_and_missing_tensors_are_listed_before_reading(tmp_path):
    state, path = _folder(tmp_path)
    folder = open_folder(path)
    targets = {n: a.shape for n, a in state.items()}
    targets["decoder.layers.0.self_attention.linear_q.weight"] = (32, 64)      # a config with more heads
    targets["decoder.layers.2.input_layernorm.weight"] = (32,)                  # a config with more layers
    with pytest.raises(FolderError) as err:
        load_hf_weights(folder, LLAMA_HF, targets)
    text = str(err.value)
    assert "'model.layers.0.self_attn.q_proj.weight' in model.safetensors has shape [32, 32], the model config " \
           "gives [64, 32]" in text
    assert "'model.layers.2.input_layernorm.weight' (for our decoder.layers.2.input_layernorm.weight) is not" in text


def test_python_files_in_the_folder_are_never_imported(tmp_path):
    state, path = _folder(tmp_path)
    marker = tmp_path / "imported"
    with open(os.path.join(path, "modeling_evil.py"), "w") as f:
        f.write(f"open({str(marker)!r}, 'w').write('ran')\n")
    folder = open_folder(path)
    load_hf_weights(folder, LLAMA_HF, {n: a.shape for n, a in state.items()})
    assert not marker.exists()


def test_export_refuses_an_existing_folder(exported, tmp_path):
    state, path = exported
    with pytest.raises(FileExistsError, match="exists"):
        export_folder(path, state, LLAMA_HF, CONFIG)
