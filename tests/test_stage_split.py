"""Stage split: layer ranges, Megatron-style offsets, explicit splits, cutting a Cell into stages (in-process)."""
import re

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.common.placement import (format_layer_ranges, get_transformer_layer_offset, layers_of_stage,
                                              parse_layer_ranges, stage_layer_ranges)
from mindformers_core.pipeline.stage_split import split_model


# ---- parse / format -----------------------------------------------------------------------------

def test_parse_layer_ranges():
    assert parse_layer_ranges("0-3,8-11") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_layer_ranges(" 5 , 7 - 8,10") == [5, 7, 8, 10]
    assert parse_layer_ranges("") == []
    for layers in ([0, 1, 2, 3, 8], [5], [1, 3, 4], []):
        assert parse_layer_ranges(format_layer_ranges(layers)) == layers
    assert format_layer_ranges(range(4, 8)) == "4-7"


@pytest.mark.parametrize("text, message", [
    ("0-3,2-5", "'0-3,2-5' lists layer(s) [2, 3] twice"),
    ("3-0", "range '3-0' in '3-0' goes down; write it as '0-3'"),
    ("8-11,0-3", "'0-3' comes after layer 11 in '8-11,0-3'; list ranges in increasing order"),
    ("0-3,,5", "bad token '' in '0-3,,5'"),
    ("a-b", "bad token 'a-b'"),
    ("-1", "bad token '-1'"),
    ("1-2-3", "bad token '1-2-3'"),
])
def test_parse_layer_ranges_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_layer_ranges(text)


def test_parse_layer_ranges_bad_token_message_says_what_is_valid():
    with pytest.raises(ValueError, match=re.escape("write comma-separated layer indices or inclusive ranges, "
                                                   "e.g. '0-3,8-11' or '5'")):
        parse_layer_ranges("x")
    with pytest.raises(TypeError, match="expected a string"):
        parse_layer_ranges([0, 1])


# ---- offsets and stage layers -----------------------------------------------------------------

@pytest.mark.parametrize("num_layers, pp, vpp", [(8, 4, None), (16, 4, 2), (24, 2, 3), (6, 1, 3)])
def test_uniform_offset_matches_megatron_formula(num_layers, pp, vpp):
    v = vpp or 1
    per_rank = num_layers // pp
    covered = []
    for vp in range(v):
        for rank in range(pp):
            # Megatron: vp_stage * (num_layers // vpp) + pp_rank * (layers per rank // vpp)
            expected = vp * (num_layers // v) + rank * (per_rank // v)
            assert get_transformer_layer_offset(num_layers, pp, rank, vpp, vp if vpp else None) == expected
            info = layers_of_stage(num_layers, pp, rank, vpp, vp if vpp else None)
            assert info.stage_index == vp * pp + rank and info.stage_num == pp * v
            assert info.layers == list(range(expected, expected + num_layers // (pp * v)))
            covered += info.layers
    assert sorted(covered) == list(range(num_layers))


def test_embedding_on_first_and_output_on_last_stage():
    flags = {(r, vp): (s.has_embedding, s.has_output)
             for r in range(4) for vp in range(2) for s in [layers_of_stage(16, 4, r, 2, vp)]}
    assert flags.pop((0, 0)) == (True, False) and flags.pop((3, 1)) == (False, True)
    assert set(flags.values()) == {(False, False)}
    solo = layers_of_stage(4, 1, 0)
    assert (solo.has_embedding, solo.has_output, solo.layers) == (True, True, [0, 1, 2, 3])
    # V placement (ZBV): rank 0 holds the first and the last stage
    last = layers_of_stage(8, 2, 0, 2, 1, placement="v")
    assert (last.stage_index, last.layers, last.has_output) == (3, [6, 7], True)


def test_explicit_counts_and_per_stage_lists():
    assert [list(r) for r in stage_layer_ranges(16, 4, layers_per_stage=[3, 5, 5, 3])] == \
        [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15]]
    assert get_transformer_layer_offset(16, 4, 2, layers_per_stage=[3, 5, 5, 3]) == 8
    # one entry per stage; a stage may hold no transformer layer (here the output stage)
    lists = ["0-4", [5, 6, 7, 8], "9-11", ""]
    info = layers_of_stage(12, 4, 3, layers_per_stage=lists)
    assert (info.layers, info.offset, info.has_output) == ([], 12, True)
    assert layers_of_stage(12, 4, 1, layers_per_stage=lists).layers == [5, 6, 7, 8]


def test_explicit_ranges_per_pipeline_rank_with_virtual_stages():
    per_rank = ["0-3,8-11", "4-7,12-15"]
    got = {(r, vp): layers_of_stage(16, 2, r, 2, vp, layers_per_stage=per_rank) for r in range(2) for vp in range(2)}
    assert got[(0, 0)].layers == [0, 1, 2, 3] and got[(1, 0)].layers == [4, 5, 6, 7]
    assert got[(0, 1)].layers == [8, 9, 10, 11] and got[(1, 1)].layers == [12, 13, 14, 15]
    assert [got[k].offset for k in [(0, 0), (1, 0), (0, 1), (1, 1)]] == [0, 4, 8, 12]
    assert got[(0, 0)].has_embedding and got[(1, 1)].has_output
    uneven = stage_layer_ranges(10, 2, 2, ["0-1,5-7", "2-4,8-9"])
    assert [format_layer_ranges(r) for r in uneven] == ["0-1", "2-4", "5-7", "8-9"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_layers=10, pp_size=4), "num_layers=10 is not divisible by pp_size=4 x vpp_size=1 = 4 stages; "
                                     "pass layers_per_stage"),
    (dict(num_layers=12, pp_size=4, vpp_size=2), "num_layers=12 is not divisible by pp_size=4 x vpp_size=2 = 8"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=[8, 7]), "layer counts [8, 7] must be 2 non-negative numbers "
                                                              "(one per stage: pp_size=2 x vpp_size=1) summing to "
                                                              "num_layers=16"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["0-15"]), "layers_per_stage has 1 entries; give one per "
                                                                "stage (2 = pp_size 2 x vpp_size 1)"),
    (dict(num_layers=16, pp_size=2, vpp_size=2, layers_per_stage=["0-15"] * 3),
     "give one per stage (4 = pp_size 2 x vpp_size 2) or one per pipeline rank (2)"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["0-6", "8-15"]), "layers [7] are in no entry of "
                                                                       "layers_per_stage"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["0-7", "7-15"]), "layer 7 is in layers_per_stage[0] and "
                                                                       "layers_per_stage[1]; every layer must "
                                                                       "belong to exactly one stage"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["0-7", "8-16"]), "layer 16 of layers_per_stage[1] is out of "
                                                                       "range for num_layers=16"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["0-2,5", "3-4,6-15"]), "the layers of stage 0 ('0-2,5') are "
                                                                             "not consecutive"),
    (dict(num_layers=16, pp_size=2, layers_per_stage=["8-15", "0-7"]), "stage 0's layers '8-15' come after stage "
                                                                       "1's '0-7'"),
    (dict(num_layers=16, pp_size=2, vpp_size=2, layers_per_stage=["0-7", "8-15"]),
     "in model order the layers run over pipeline ranks [0, 1], but the 4 stages sit on ranks [0, 1, 0, 1]; "
     "each rank's entry must form exactly 2 runs"),
    (dict(num_layers=8, pp_size=2, vpp_size=2, layers_per_stage=["0-1,6-7", "2-5"], placement="v"),
     "placement 'v' puts consecutive stages on one rank ([0, 1, 1, 0]), so per-rank layer lists are ambiguous"),
    (dict(num_layers=0, pp_size=2), "num_layers=0 must be a positive integer"),
    (dict(num_layers=4, pp_size=2, layers_per_stage=["0-1", [3, 2]]), "layers [3, 2] must be strictly increasing"),
])
def test_stage_split_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        stage_layer_ranges(**kwargs)


def test_stage_selection_errors():
    with pytest.raises(ValueError, match=re.escape("vpp_size=2: say which virtual stage with vp_stage in [0, 2)")):
        layers_of_stage(16, 2, 0, vpp_size=2)
    with pytest.raises(ValueError, match=re.escape("pp_rank=2 must be in [0, 2) for pp_size=2")):
        layers_of_stage(16, 2, 2)
    with pytest.raises(ValueError, match=re.escape("vp_stage=2 must be in [0, 2) for vpp_size=2")):
        get_transformer_layer_offset(16, 2, 0, 2, 2)
    with pytest.raises(TypeError, match="layers_per_stage='0-7' must be a list"):
        stage_layer_ranges(8, 1, layers_per_stage="0-7")
    with pytest.raises(TypeError, match=re.escape("layers_per_stage[1]: 3.5 is not a layer list")):
        stage_layer_ranges(8, 2, layers_per_stage=["0-3", 3.5])


# ---- split_model ------------------------------------------------------------------------------

class Tiny(nn.Cell):
    """Embedding + layers + output head; construct skips parts a stage does not hold."""

    def __init__(self, container="list", n_layers=4):
        super().__init__()
        self.embedding = nn.Embedding(10, 8)
        dense = [nn.Dense(8, 8, activation="tanh") for _ in range(n_layers)]
        if container == "list":
            self.layers = nn.CellList(dense)
        elif container == "seq":
            self.layers = nn.SequentialCell(dense)
        else:
            self.layers = nn.CellDict({f"block{i}": d for i, d in enumerate(dense)})
        self.output = nn.Dense(8, 3)

    def construct(self, x):
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in (self.layers.values() if isinstance(self.layers, nn.CellDict) else self.layers):
            x = layer(x)
        if self.output is not None:
            x = self.output(x)
        return x


def copies(n, container="list"):
    ms.set_seed(1)
    models = [Tiny(container) for _ in range(n + 1)]
    for other in models[1:]:
        for p, q in zip(models[0].get_parameters(), other.get_parameters()):
            q.set_data(Tensor(p.asnumpy()))
    return models


IDS = Tensor(np.array([[1, 2, 3], [4, 5, 9]]), ms.int32)


def names(cell):
    return [p.name for p in cell.get_parameters()]


def test_split_model_two_stages_keeps_names_and_matches_full_model():
    full, s0, s1 = copies(2)
    expected = full(IDS).asnumpy()
    assert split_model(s0, 0, 2) is s0
    split_model(s1, 1, 2)
    assert names(s0) == ["embedding.embedding_table", "layers.0.weight", "layers.0.bias",
                         "layers.1.weight", "layers.1.bias"]
    assert names(s1) == ["layers.2.weight", "layers.2.bias", "layers.3.weight", "layers.3.bias",
                         "output.weight", "output.bias"]
    assert s0.output is None and s1.embedding is None and len(s0.layers) == 2
    hidden = s0(IDS)
    assert hidden.shape == (2, 3, 8)
    np.testing.assert_allclose(s1(hidden).asnumpy(), expected, rtol=1e-6, atol=1e-6)


def test_split_model_virtual_stages_from_per_rank_ranges():
    full, *stages = copies(4)
    expected = full(IDS).asnumpy()
    per_rank = ["0,2", "1,3"]                        # pp=2, vpp=2: stage s holds layer s
    x = IDS
    for s, model in enumerate(stages):
        info = layers_of_stage(4, 2, s % 2, 2, s // 2, layers_per_stage=per_rank)
        assert info.stage_index == s
        split_model(model, info.stage_index, info.stage_num, layer_ids=info.layers)
        assert names(model) == (["embedding.embedding_table"] if info.has_embedding else []) + \
            [f"layers.{s}.weight", f"layers.{s}.bias"] + (["output.weight", "output.bias"] if info.has_output else [])
        x = model(x)
    np.testing.assert_allclose(x.asnumpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("container, key", [("seq", "layers.{}"), ("dict", "layers.block{}")])
def test_split_model_sequential_and_dict_layers(container, key):
    full, model = copies(1, container)
    split_model(model, 1, 3, layer_ids="1-2")       # a middle stage: no embedding, no output
    assert type(model.layers) is type(full.layers) and len(model.layers) == 2
    assert names(model) == [f"{key.format(i)}.{w}" for i in (1, 2) for w in ("weight", "bias")]
    assert model.embedding is None and model.output is None
    hidden = full.embedding(IDS)
    expected = full.layers[2 if container == "seq" else "block2"](
        full.layers[1 if container == "seq" else "block1"](hidden))
    np.testing.assert_allclose(model(hidden).asnumpy(), expected.asnumpy(), rtol=1e-6)


def test_split_model_errors():
    model = copies(0)[0]
    with pytest.raises(TypeError, match="model must be a mindspore.nn.Cell, got dict"):
        split_model({}, 0, 2)
    with pytest.raises(ValueError, match=re.escape("stage_index=2 must be in [0, 2)")):
        split_model(model, 2, 2)
    with pytest.raises(TypeError, match=re.escape("model.blocks is NoneType; it must be an nn.CellList, "
                                                  "nn.SequentialCell or nn.CellDict")):
        split_model(model, 0, 2, layers_attr="blocks")
    with pytest.raises(ValueError, match=re.escape("model has no attribute(s) ['head'] (first_attrs/last_attrs); "
                                                   "its sub-cells are ['embedding', 'layers', 'output']")):
        split_model(model, 0, 2, last_attrs=("head",))
    with pytest.raises(ValueError, match=re.escape("layer_ids '3-4' go beyond the model's 4 layers")):
        split_model(model, 0, 2, layer_ids="3-4")
    with pytest.raises(ValueError, match=re.escape("model.layers has 4 layers, not divisible by stage_num=3")):
        split_model(model, 0, 3)
    assert len(model.layers) == 4 and model.embedding is not None and model.output is not None   # untouched
