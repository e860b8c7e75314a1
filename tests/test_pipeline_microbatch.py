"""Microbatch split/merge specs and the per-model / per-call config (in-process, no communication)."""
import re
from collections import namedtuple

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.pipeline.microbatch import (MicrobatchConfig, ReplicateSpec, TensorChunkSpec,
                                                  merge_microbatches, split_microbatches)
from mindformers_core.sharding.layout import Replicate as PlacementReplicate

Pair = namedtuple("Pair", "a b")


def t(shape, dtype=np.float32):
    return Tensor(np.arange(int(np.prod(shape))).reshape(shape).astype(dtype))


def same(x, y):
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    assert x.shape == y.shape and x.dtype == y.dtype
    np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())


def nested():
    return {"ids": (t((6, 4), np.int32), t((6, 2, 3))), "scale": Tensor(2.5, ms.float32), "name": "lm",
            "opts": [7, None, Pair(t((6,)), "x")]}


# ---- split --------------------------------------------------------------------------------------

def test_auto_split_nested_keeps_structure_splits_dim0_and_replicates_the_rest():
    x = nested()
    mbs = split_microbatches(x, 3)
    assert len(mbs) == 3
    for i, mb in enumerate(mbs):
        assert type(mb) is dict and list(mb) == ["ids", "scale", "name", "opts"]
        assert type(mb["ids"]) is tuple and type(mb["opts"]) is list and type(mb["opts"][2]) is Pair
        same(mb["ids"][0], Tensor(x["ids"][0].asnumpy()[2 * i:2 * i + 2]))
        same(mb["ids"][1], Tensor(x["ids"][1].asnumpy()[2 * i:2 * i + 2]))
        same(mb["opts"][2].a, Tensor(x["opts"][2].a.asnumpy()[2 * i:2 * i + 2]))
        assert mb["scale"] is x["scale"]                       # 0-dim tensor: replicated, not split
        assert mb["name"] == "lm" and mb["opts"][:2] == [7, None] and mb["opts"][2].b == "x"


def test_single_leaf_and_micro_batch_num_one():
    x = t((4, 2))
    (only,) = split_microbatches(x, 1)
    same(only, x)
    assert split_microbatches("not a tensor", 3) == ["not a tensor"] * 3


def test_per_leaf_specs_split_dim1_for_one_leaf_and_replicate_another():
    x = {"ids": t((4, 6)), "table": t((5, 3)), "mask": t((4, 1)), "step": 3}
    spec = {"ids": TensorChunkSpec(1), "table": ReplicateSpec()}   # absent keys: automatic
    mbs = split_microbatches(x, 2, spec)
    for i, mb in enumerate(mbs):
        same(mb["ids"], Tensor(x["ids"].asnumpy()[:, 3 * i:3 * i + 3]))
        assert mb["table"] is x["table"]                        # 5 rows would not split in 2
        same(mb["mask"], Tensor(x["mask"].asnumpy()[2 * i:2 * i + 2]))
        assert mb["step"] == 3


def test_spec_tree_with_tuples_negative_dim_and_replicate_class():
    x = (t((2, 4)), (t((3, 4)), "tag"), Tensor(1.0))
    mbs = split_microbatches(x, 2, (None, (TensorChunkSpec(-1), ReplicateSpec), None))
    same(mbs[1][0], Tensor(x[0].asnumpy()[1:]))
    same(mbs[1][1][0], Tensor(x[1][0].asnumpy()[:, 2:]))
    assert mbs[1][1][1] == "tag" and mbs[0][2] is x[2]


def test_one_spec_for_all_tensor_leaves_replicates_scalars_and_non_tensors():
    x = {"a": t((2, 4)), "b": [t((3, 6)), Tensor(4.0), "s"]}
    mbs = split_microbatches(x, 2, TensorChunkSpec(1))
    same(mbs[0]["a"], Tensor(x["a"].asnumpy()[:, :2]))
    same(mbs[1]["b"][0], Tensor(x["b"][0].asnumpy()[:, 3:]))
    assert mbs[1]["b"][1] is x["b"][1] and mbs[1]["b"][2] == "s"
    # a replicate spec on a container replicates the tensors inside too
    rep = split_microbatches(x, 2, {"b": ReplicateSpec()})
    assert rep[1]["b"] is x["b"]


def test_custom_split_callables_at_the_root_and_at_a_leaf():
    x = (t((4, 2)), t((4, 2)))

    def halves_reversed(args, m):
        a, b = args
        return [(a[i::m], b) for i in range(m)]                 # strided, second replicated
    mbs = split_microbatches(x, 2, halves_reversed)
    same(mbs[1][0], Tensor(x[0].asnumpy()[1::2]))
    assert mbs[0][1] is x[1]
    leaf = split_microbatches({"k": x[0], "n": 5}, 2, {"n": lambda v, m: [v + i for i in range(m)]})
    assert [mb["n"] for mb in leaf] == [5, 6]
    same(leaf[1]["k"], Tensor(x[0].asnumpy()[2:]))


def test_custom_split_must_return_m_items():
    with pytest.raises(ValueError, match=re.escape("the custom split for inputs returned 1 items; it must "
                                                   "return a list of micro_batch_num=2 items")):
        split_microbatches(t((4,)), 2, lambda a, m: [a])
    with pytest.raises(ValueError, match=r"custom split for labels\['y'\] returned Tensor"):
        split_microbatches({"y": t((4,))}, 2, {"y": lambda a, m: a}, name="labels")


# ---- split errors -------------------------------------------------------------------------------

def test_not_divisible_names_leaf_path_shape_dim_and_micro_batch_num():
    with pytest.raises(ValueError) as err:
        split_microbatches({"ids": (t((6,)), t((6, 5)))}, 3, {"ids": (None, TensorChunkSpec(1))})
    assert str(err.value) == (
        "split_microbatches: inputs['ids'][1] of shape (6, 5) cannot be split along dim 1 into micro_batch_num=3 "
        "equal microbatches (5 % 3 = 2); use a micro_batch_num that divides 5, or another spec for this leaf "
        "(TensorChunkSpec(dim), ReplicateSpec())")


def test_fewer_elements_than_microbatches():
    with pytest.raises(ValueError, match=re.escape("inputs[0] of shape (2, 3) has 2 elements along dim 0, "
                                                   "fewer than micro_batch_num=4; use micro_batch_num <= 2")):
        split_microbatches([t((2, 3))], 4)


def test_dim_out_of_range_and_chunk_spec_on_a_non_tensor_or_scalar():
    with pytest.raises(ValueError, match=re.escape("inputs of shape (4, 2) has no dim 2 (TensorChunkSpec(2)); "
                                                   "valid dims are -2..1")):
        split_microbatches(t((4, 2)), 2, TensorChunkSpec(2))
    with pytest.raises(ValueError, match=re.escape("TensorChunkSpec(0) at inputs['n'], but it is a int 3: only "
                                                   "tensors with ndim > 0 can be split; use ReplicateSpec()")):
        split_microbatches({"n": 3}, 2, {"n": TensorChunkSpec(0)})
    with pytest.raises(ValueError, match=r"at inputs\[1\], but it is a tensor of shape \(\)"):
        split_microbatches((t((2,)), Tensor(1.0)), 2, (None, TensorChunkSpec(0)))


@pytest.mark.parametrize("spec, problem", [
    ((None,), "the input there is a tuple of 2 items but the spec has 1 entries"),
    ({"ids": None}, "the input there is a tuple of 2 items but the spec is a dict"),
    ([None, (None, None)], "the spec at inputs[1] is a tuple but the input there is a leaf (int 5)"),
])
def test_spec_tree_must_mirror_input(spec, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        split_microbatches((t((2,)), 5), 2, spec)


def test_dict_spec_with_unknown_key():
    with pytest.raises(ValueError, match=re.escape("the spec at inputs does not match the input structure: the "
                                                   "input there is a dict with keys ['a'] but the spec has keys "
                                                   "['b'] that the input lacks")):
        split_microbatches({"a": t((2,))}, 2, {"b": ReplicateSpec()})


@pytest.mark.parametrize("spec, shown", [
    ("dim0", "'dim0' of type str"), (0, "0 of type int"), (True, "True of type bool"),
    (TensorChunkSpec, "TensorChunkSpec needs a dim"), (PlacementReplicate(), "Replicate() of type Replicate"),
])
def test_bad_split_spec_types_name_what_is_valid(spec, shown):
    with pytest.raises(TypeError) as err:
        split_microbatches(t((2,)), 2, spec)
    assert shown in str(err.value)
    assert "valid are None (automatic), TensorChunkSpec(dim), ReplicateSpec()" in str(err.value)
    with pytest.raises(TypeError, match=re.escape("split spec for inputs['x'][1]: 'bad'")):
        split_microbatches({"x": (1, 2)}, 2, {"x": (None, "bad")})


def test_bad_micro_batch_num_and_chunk_dim():
    for m in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="micro_batch_num=.* must be a positive integer"):
            split_microbatches(t((4,)), m)
    with pytest.raises(TypeError, match="dim='1' must be an int"):
        TensorChunkSpec("1")


# ---- merge --------------------------------------------------------------------------------------

def test_auto_merge_inverts_auto_split_and_averages_scalars():
    x = nested()
    merged = merge_microbatches(split_microbatches(x, 3))
    same(merged["ids"][0], x["ids"][0])
    same(merged["ids"][1], x["ids"][1])
    same(merged["opts"][2].a, x["opts"][2].a)
    assert type(merged["opts"][2]) is Pair and merged["name"] == "lm" and merged["opts"][:2] == [7, None]
    same(merged["scale"], Tensor(2.5, ms.float32))
    losses = [{"loss": Tensor(v, ms.float32), "n": 2} for v in (1.0, 2.0, 6.0)]
    out = merge_microbatches(losses)
    assert out["n"] == 2 and out["loss"].shape == () and float(out["loss"].asnumpy()) == pytest.approx(3.0)
    ints = merge_microbatches([Tensor(1, ms.int32), Tensor(2, ms.int32)])
    assert ints.dtype == ms.float32 and float(ints.asnumpy()) == 1.5


def test_merge_specs_dim_replicate_false_and_callables():
    outs = [(t((2, 3)) + i, t((2,)), "tag") for i in range(2)]
    merged = merge_microbatches(outs, (TensorChunkSpec(1), ReplicateSpec(), None))
    assert merged[0].shape == (2, 6)
    np.testing.assert_array_equal(merged[0].asnumpy()[:, 3:], outs[1][0].asnumpy())
    same(merged[1], outs[0][1])
    assert merged[2] == "tag"
    assert merge_microbatches(outs, False) == outs and merge_microbatches(outs, False) is not outs
    kept = merge_microbatches(outs, (None, False, True))
    assert kept[1] == [outs[0][1], outs[1][1]] and kept[0].shape == (4, 3)
    total = merge_microbatches([{"loss": Tensor(1.0)}, {"loss": Tensor(2.0)}], {"loss": lambda vs: sum(vs[1:], vs[0])})
    assert float(total["loss"].asnumpy()) == 3.0
    assert merge_microbatches(outs, lambda vs: len(vs)) == 2
    same(merge_microbatches(outs, TensorChunkSpec(-1))[0], merged[0])


def test_merge_errors():
    with pytest.raises(ValueError, match=re.escape("outputs['n'] differs between microbatches: microbatch 0 gave "
                                                   "int 1, microbatch 2 gave int 3; values that are not split must "
                                                   "be equal")):
        merge_microbatches([{"n": 1}, {"n": 1}, {"n": 3}])
    with pytest.raises(ValueError, match=r"outputs\[0\] differs between microbatches: .*tensor of shape \(2,\)"):
        merge_microbatches([(t((2,)),), (t((2,)) + 1,)], (ReplicateSpec(),))
    with pytest.raises(ValueError, match=r"outputs\[1\] is a tensor in some microbatches but not in others"):
        merge_microbatches([(1, t((2,))), (1, 5)])
    with pytest.raises(ValueError, match=r"outputs has a different structure in microbatch 1"):
        merge_microbatches([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match=re.escape("cannot concatenate outputs along dim 0: the microbatches have "
                                                   "shapes [(2, 3), (2, 4)]")):
        merge_microbatches([t((2, 3)), t((2, 4))])
    with pytest.raises(ValueError, match=r"TensorChunkSpec\(0\) at outputs\[1\], but it is a tensor of shape \(\)"):
        merge_microbatches([(t((2,)), Tensor(1.0))] * 2, (None, TensorChunkSpec(0)))
    with pytest.raises(ValueError, match="outputs must be a non-empty list with one entry per microbatch"):
        merge_microbatches([])
    with pytest.raises(TypeError, match=r"merge spec for outputs: 'cat' of type str is not a microbatch spec; valid "
                                        r"are None or True \(automatic\), False"):
        merge_microbatches([1, 1], "cat")
    with pytest.raises(ValueError, match="the spec at outputs is a tuple but the output there is a leaf"):
        merge_microbatches([1, 1], (None,))


# ---- config -------------------------------------------------------------------------------------

def test_config_per_model_overridden_per_call():
    model_cfg = MicrobatchConfig(split_input={"table": ReplicateSpec()}, merge_output=False)
    call_cfg = model_cfg.override(split_label=TensorChunkSpec(1), merge_output=None)
    assert model_cfg.split_label is None                                  # unchanged
    assert call_cfg.split_input == {"table": ReplicateSpec()} and call_cfg.merge_output is False
    assert call_cfg.split_label == TensorChunkSpec(1)
    auto = model_cfg.override(MicrobatchConfig(merge_output=True))
    assert auto.merge_output is True and auto.split_input == model_cfg.split_input

    x = {"ids": t((4, 2)), "table": t((3, 2))}
    mbs = call_cfg.split_inputs(x, 2)
    assert mbs[1]["table"] is x["table"] and mbs[1]["ids"].shape == (2, 2)
    labels = call_cfg.split_labels(t((2, 4)), 2)
    assert [lb.shape for lb in labels] == [(2, 2), (2, 2)]
    assert call_cfg.merge_outputs(labels) == labels                       # merge_output=False
    same(auto.merge_outputs(labels), Tensor(np.concatenate([lb.asnumpy() for lb in labels])))   # auto: dim 0
    with pytest.raises(ValueError, match=re.escape("labels of shape (2, 3) cannot be split along dim 1")):
        call_cfg.split_labels(t((2, 3)), 2)


def test_config_errors():
    with pytest.raises(TypeError, match=r"split_label: 'dim0' of type str is not a microbatch spec"):
        MicrobatchConfig(split_label="dim0")
    with pytest.raises(TypeError, match=r"split_input\[0\]: False of type bool"):
        MicrobatchConfig(split_input=(False,))
    with pytest.raises(TypeError, match=re.escape("unknown setting(s) ['split_inputs']; valid are ['split_input', "
                                                  "'split_label', 'merge_output']")):
        MicrobatchConfig().override(split_inputs=None)
    with pytest.raises(TypeError, match="merge_output: 3 of type int"):
        MicrobatchConfig().override(merge_output=3)
