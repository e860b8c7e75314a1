"""Lean loading of a Hugging Face folder (models/hf/loader.py, folder.py, transformer/init.py): no random draws
for weights the folder overwrites, one tensor at a time straight into the parameters, bfloat16 converted
exactly, every slice of a layout equal to the whole tensor's region. The reference is the plain path: every
tensor read whole by the ``safetensors`` package, mapped by the family's table (``from_hf``) and cast with
NumPy's ``astype``. Fixtures: tests/data/hf (made by transformers); no torch."""
import json
import os
import struct

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor
from safetensors import safe_open

from mindformers_core.models import state_dict as state_dict_module
from mindformers_core.models.hf import folder as folder_module
from mindformers_core.models.hf.config import read_hf_config
from mindformers_core.models.hf.folder import FolderError, open_folder
from mindformers_core.models.hf.loader import HFWeights, fill_parameter, load_hf_weights
from mindformers_core.models.hf.pretrained import from_pretrained
from mindformers_core.models.llama.hf import LLAMA_HF
from mindformers_core.sharding.layout import Layout
from mindformers_core.transformer import init as init_module

DATA = os.path.join(os.path.dirname(__file__), "data", "hf")
FOLDERS = ["llama", "llama_bf16", "qwen2", "qwen3", "qwen3_moe_sharded", "deepseek_v3"]


def reference_state(path, adapter, names):
    """The plain path: whole tensors through safetensors, ``from_hf``, then fp32 with ``astype``."""
    folder = open_folder(path)
    hf = {}
    for name, info in folder.tensors.items():
        with safe_open(info.file, framework="np") as f:
            hf[name] = f.get_tensor(name)
    return {k: v.astype(np.float32) for k, v in adapter.from_hf(hf, names).items()}


def count_draws(monkeypatch):
    calls = []
    real = init_module.normal_array

    def counting(key, shape, std):
        calls.append(key)
        return real(key, shape, std)
    monkeypatch.setattr(init_module, "normal_array", counting)
    return calls


@pytest.mark.parametrize("name", FOLDERS)
def test_from_pretrained_draws_nothing_and_loads_the_plain_paths_values(name, monkeypatch):
    path = os.path.join(DATA, name)
    spec, _, _ = read_hf_config(path)
    calls = count_draws(monkeypatch)
    model = from_pretrained(path, seq_length=16)
    assert calls == []                                   # every weight came from the folder: nothing drawn
    held = set(open_folder(path).tensors)

    def in_folder(p):
        try:
            return set(spec.state_dict_adapter.hf_names(p.name, tuple(p.shape))) <= held
        except KeyError:
            return False
    loaded = {p.name: p for p in model.get_parameters() if p.requires_grad or in_folder(p)}
    expected = reference_state(path, spec.state_dict_adapter, list(loaded))
    for pname, p in loaded.items():
        got = p.asnumpy()
        assert got.dtype == np.float32 and np.array_equal(got, expected[pname]), pname
    # the same model built the usual way draws its random weights
    calls.clear()
    spec.model_class(model.config)
    assert calls


def test_bf16_fixture_is_exact_and_equal_to_the_fp32_fixtures_rounding():
    """``llama_bf16`` holds ``llama``'s weights rounded to bfloat16: loaded as float32 they are exactly the
    bf16 values (the upper 16 bits of each float32), read by slice as well as whole."""
    path = os.path.join(DATA, "llama_bf16")
    folder = open_folder(path)
    assert {i.dtype for i in folder.tensors.values()} == {"BF16"}
    shapes = fixture_targets(folder, LLAMA_HF)
    names = list(shapes)
    fast = load_hf_weights(folder, LLAMA_HF, shapes, dtype="float32")
    raw = load_hf_weights(folder, LLAMA_HF, shapes)                         # the file's dtype
    for n in names:
        assert raw[n].dtype.name == "bfloat16" and fast[n].dtype == np.float32
        assert np.array_equal(fast[n], raw[n].astype(np.float32)), n        # MindSpore's bfloat16 cast
        assert not (fast[n].view(np.uint32) & 0xFFFF).any(), n
    fp32 = load_hf_weights(open_folder(os.path.join(DATA, "llama")), LLAMA_HF, shapes)
    name = "decoder.layers.1.mlp.linear_fc2.weight"
    assert np.abs(fast[name] - fp32[name]).max() <= np.abs(fp32[name]).max() * 2 ** -8


def write_bf16_file(path, tensors):
    """A safetensors file by hand: each array of uint16 bit patterns stored as BF16."""
    header, offset, blobs = {}, 0, []
    for name, bits in tensors.items():
        data = np.ascontiguousarray(bits, dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_bf16_special_values_convert_exactly(tmp_path):
    """+-0, subnormals, the largest finite, +-inf and NaN payloads: the float32 bits are the bf16 bits << 16,
    whole and by transposed slice."""
    special = np.array([0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81,
                        0x3F80, 0xBF80], np.uint16)
    bits = np.resize(special, (12, 10))
    bits[:, 1:] = np.random.default_rng(0).integers(0, 1 << 16, size=(12, 9), dtype=np.uint16)
    folder_path = tmp_path / "bf16"
    folder_path.mkdir()
    (folder_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    write_bf16_file(str(folder_path / "model.safetensors"), {"lm_head.weight": bits})
    folder = open_folder(str(folder_path))
    expected = (bits.astype(np.uint32) << 16).T                         # ours is (in, out): transposed
    whole = load_hf_weights(folder, LLAMA_HF, {"output_layer.weight": (10, 12)}, dtype="float32")
    assert np.array_equal(whole["output_layer.weight"].view(np.uint32), expected)
    mesh = Layout((2,), ("tp",))
    for rank in range(2):
        part = load_hf_weights(folder, LLAMA_HF, {"output_layer.weight": ((10, 12), mesh("None", "tp"))}, rank,
                               dtype="float32")["output_layer.weight"]
        assert np.array_equal(part.view(np.uint32), expected[:, rank * 6:(rank + 1) * 6])


def fixture_targets(folder, adapter):
    """``{our name: our global shape}`` of every tensor of a folder (stacked experts counted)."""
    out = {}
    for hf, info in folder.tensors.items():
        ours = adapter.ours_of_hf(hf)
        if ours is None or ours in out:
            continue
        hf_shape, lead = tuple(info.shape), ()
        if len(adapter.hf_names(ours, (2,) + hf_shape)) == 2:          # stacked: count the experts present
            count = 0
            while adapter.hf_names(ours, (count + 1,) + hf_shape)[-1] in folder.tensors:
                count += 1
            lead = (count,)
        for inner in (hf_shape, hf_shape[::-1]):
            if all(v == hf_shape for v in adapter.hf_shapes(ours, lead + inner).values()):
                out[ours] = lead + inner
                break
    return out


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe_sharded", "deepseek_v3"])
@pytest.mark.parametrize("small_blocks", [False, True])
def test_every_rank_region_of_every_layout_equals_the_whole_tensors_region(name, small_blocks, monkeypatch):
    """tp / ep slices on every dim, transposed or not, stacked experts: each rank's region read by slice (in
    blocks of a few rows when ``small_blocks``) equals the region of the whole tensor, in float32 and in the
    file's dtype."""
    if small_blocks:
        monkeypatch.setattr(state_dict_module, "READ_BLOCK_BYTES", 96)
        monkeypatch.setattr(state_dict_module, "TRANSPOSE_ROWS", 3)
    path = os.path.join(DATA, name)
    spec, _, _ = read_hf_config(path)
    adapter, folder = spec.state_dict_adapter, open_folder(path)
    shapes = fixture_targets(folder, adapter)
    whole = load_hf_weights(folder, adapter, shapes, dtype="float32")
    mesh = Layout((2,), ("tp",))
    checked = 0
    for ours, shape in shapes.items():
        for dim in range(len(shape)):
            if shape[dim] % 2:
                continue
            entries = ["None"] * len(shape)
            entries[dim] = "tp"
            layout = mesh(*entries)
            for rank in range(2):
                with HFWeights(folder, adapter, {ours: (shape, layout)}, rank, dtype="float32") as weights:
                    part = weights[ours]
                region = tuple(layout.local_slice(shape, rank))
                assert np.array_equal(part, whole[ours][region]), (ours, dim, rank)
                checked += 1
    assert checked > 2 * len(shapes)


def test_fill_parameter_writes_into_the_parameters_own_memory():
    """The trainer's path: each rank's Parameter (local shape, fp32) filled in place -- same object, same
    buffer -- with its slice; a bf16 Parameter gets the file's bf16 values."""
    path = os.path.join(DATA, "llama_bf16")
    folder = open_folder(path)
    name = "decoder.layers.0.self_attention.linear_q.weight"            # (in 64, out 64), column-parallel
    layout = Layout((2,), ("tp",))("None", "tp")
    full = load_hf_weights(folder, LLAMA_HF, {name: (64, 64)}, dtype="float32")[name]
    for rank in range(2):
        p = Parameter(Tensor(np.zeros((64, 32), np.float32)), name=name)
        before = p.asnumpy().__array_interface__["data"][0]
        with HFWeights(folder, LLAMA_HF, {name: ((64, 64), layout)}, rank, dtype="float32") as weights:
            fill_parameter(weights, p)
        assert p.asnumpy().__array_interface__["data"][0] == before
        assert np.array_equal(p.asnumpy(), full[:, rank * 32:(rank + 1) * 32])
    q = Parameter(Tensor(np.zeros((64, 64), np.float32), ms.bfloat16), name=name)
    with HFWeights(folder, LLAMA_HF, {name: (64, 64)}) as weights:
        fill_parameter(weights, q)
    assert np.array_equal(q.asnumpy().astype(np.float32), full)
    wrong = Parameter(Tensor(np.zeros((64, 16), np.float32)), name=name)
    with HFWeights(folder, LLAMA_HF, {name: ((64, 64), layout)}, 0) as weights:
        with pytest.raises(ValueError, match=r"\(64, 32\)"):
            fill_parameter(weights, wrong)


def test_problems_are_listed_before_anything_is_read(monkeypatch):
    reads = []
    real = folder_module.read_slice
    monkeypatch.setattr(folder_module, "read_slice", lambda *a: reads.append(a) or real(*a))
    folder = open_folder(os.path.join(DATA, "qwen2"))                  # tied: no lm_head.weight on disk
    targets = {"output_layer.weight": (64, 320),                        # the fallback: embed_tokens
               "decoder.layers.0.self_attention.linear_q.weight": (64, 32),     # misshaped
               "decoder.layers.7.mlp.linear_fc2.weight": (128, 64),              # no such layer
               "embedding.word_embeddings.weight": (320, 64)}
    with pytest.raises(FolderError) as e:
        HFWeights(folder, LLAMA_HF, targets)
    text = str(e.value)
    assert "model.layers.0.self_attn.q_proj.weight" in text and "model.layers.7.mlp.down_proj.weight" in text
    assert "lm_head" not in text and reads == []
    good = {k: v for k, v in targets.items() if "layers" not in k}
    with HFWeights(folder, LLAMA_HF, good, dtype="float32") as weights:
        assert reads == []                                              # checked, nothing read yet
        head, table = weights["output_layer.weight"], weights["embedding.word_embeddings.weight"]
    assert np.array_equal(head, table.T) and reads


def test_deferred_init_materializes_exactly_the_usual_draws():
    """A model built inside deferred_init has zeros where it would have drawn; materialize(loaded) draws the
    others with the keys and stds they would have had, so the model equals one built the usual way."""
    from mindformers_core.models import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=64,
                      seq_length=8, ffn_hidden_size=48)
    ms.set_seed(3)
    usual = {p.name: p.asnumpy() for p in LlamaForCausalLM(cfg).get_parameters()}
    with init_module.deferred_init() as deferred:
        lazy = LlamaForCausalLM(cfg)
        with pytest.raises(RuntimeError, match="already active"):
            with init_module.deferred_init():
                pass
    params = {p.name: p for p in lazy.get_parameters()}
    keep = params["decoder.layers.0.self_attention.linear_q.weight"]
    assert not keep.asnumpy().any() and len(deferred.pending) >= 9
    drawn = deferred.materialize(loaded=[keep])
    assert all(d is not keep for d in drawn) and len(drawn) >= 8 and not keep.asnumpy().any()
    for name, p in params.items():
        if p is not keep:
            assert np.array_equal(p.asnumpy(), usual[name]), name
    outside = init_module.normal_parameter("k", (2, 3), 0.1, ms.float32)     # after the block: drawn again
    assert np.count_nonzero(outside.asnumpy()) == 6
