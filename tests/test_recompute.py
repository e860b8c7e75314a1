"""Recompute and swap chosen by string-matched Cell names: patterns, layer selections, MindFormers
YAML translation, planning reports and errors (pure Python); then, on a tiny GPT, that every
configuration leaves the model's names unchanged and gives the same loss and gradients as no
recompute in PyNative and under ms.jit -- also with dropout (the random state is replayed) -- and
that the saved-activation meter sees the memory go down."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.recompute import (ActivationMeter, PatternError, RecomputeConfig, StageMap, SwapConfig, Tree,
                                        apply_recompute, apply_swap, as_recompute_config, as_swap_config,
                                        compile_pattern, from_mindformers, layers_of, model_tree, plan_recompute,
                                        plan_swap, resolve, swap_from_mindformers, translate_mindformers)
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.transformer import GPTModel, VocabParallelCrossEntropy

from tests.test_transformer import B, S, V, tiny  # noqa: E402  (one tiny config for model tests)


def batch():
    rng = np.random.RandomState(0)
    return Tensor(rng.randint(0, V, (B, S)), ms.int32), Tensor(rng.randint(0, V, (B, S)), ms.int32)


NAMES = ["embedding", "decoder", "decoder.layers"] + [
    f"decoder.layers.{i}{s}" for i in range(4) for s in
    ("", ".input_layernorm", ".self_attention", ".self_attention.linear_q", ".self_attention.core_attention",
     ".mlp", ".mlp.linear_fc1_gate", ".mlp.act", ".mlp.linear_fc2")] + ["decoder.final_layernorm", "output_layer"]


# ---- patterns and layer selections (pure) -------------------------------------------------------
@pytest.mark.parametrize("text, kind, name, hit", [
    ("decoder.layers.0.mlp.act", "glob", "decoder.layers.0.mlp.act", True),
    ("mlp.act", "glob", "decoder.layers.3.mlp.act", True),                     # dotted suffix
    ("act", "glob", "decoder.layers.3.mlp.act", True),
    ("layers.*.self_attention.core_attention", "glob", "decoder.layers.12.self_attention.core_attention", True),
    ("layers.*.attention.core_attention", "glob", "decoder.layers.1.self_attention.core_attention", False),
    ("linear_*", "glob", "decoder.layers.0.mlp.linear_fc2", True),
    ("decoder.**.act", "glob", "decoder.layers.0.mlp.act", True),
    ("ct", "glob", "decoder.layers.0.mlp.act", False),                          # whole parts only
    (".*mlp.*act", "regex", "decoder.layers.0.mlp.act", True),
    (".*mlp.*act", "regex", "decoder.layers.0.mlp.linear_fc2", False),
    (r"mlp\.linear_fc1_(gate|up)", "regex", "decoder.layers.0.mlp.linear_fc1_up", True),
    ("re:layers.0.mlp", "regex", "decoder.layers.0.mlp", True),
    ("glob:mlp", "glob", "decoder.layers.0.mlp", True),
])
def test_patterns_exact_glob_regex_and_suffixes(text, kind, name, hit):
    p = compile_pattern(text)
    assert p.kind == kind and p.matches(name) is hit


def test_pattern_and_layer_selection_errors_name_the_value():
    with pytest.raises(PatternError, match=r"where='re:\(\[' is not a valid regular expression"):
        compile_pattern("re:([", "where")
    with pytest.raises(PatternError, match="must be a non-empty string"):
        compile_pattern("")
    assert layers_of(None).admits(None) and layers_of(None).admits(7)
    assert layers_of(True).admits(3) and not layers_of("all").admits(None)
    assert layers_of("0-3,8-11").ids == frozenset([0, 1, 2, 3, 8, 9, 10, 11])
    assert layers_of([5, 1]).ids == {1, 5} and layers_of(False).empty
    with pytest.raises(PatternError, match=r"layers='3-1'.*goes down"):
        layers_of("3-1")
    with pytest.raises(PatternError, match=r"RecomputeConfig.layers=2\.5"):
        RecomputeConfig(mode="full", layers=2.5)
    with pytest.raises(PatternError, match=r"mode='partial'; valid modes are \['none', 'select', 'full'\]"):
        RecomputeConfig(mode="partial")
    with pytest.raises(PatternError, match="granularity='stage'.*needs mode='full'"):
        RecomputeConfig(mode="select", granularity="stage")


def test_config_forms_and_key_errors():
    assert as_recompute_config(None).mode == "none" and as_recompute_config(True).mode == "full"
    assert as_recompute_config("mlp.act").select == ["mlp.act"]
    assert as_recompute_config({"mode": "full", "layers": "0-1"}).layers == "0-1"
    with pytest.raises(PatternError, match=r"unknown key\(s\) \['modes'\]; give MindFormers recompute_config keys"):
        as_recompute_config({"modes": "full"})
    with pytest.raises(PatternError, match="mix the two kinds"):
        as_recompute_config({"recompute": True, "mode": "full"})
    assert as_swap_config(False) is None and as_swap_config({"swap": False}) is None
    with pytest.raises(PatternError, match=r"unknown key\(s\) \['swp'\]"):
        as_swap_config({"swp": True})


# ---- planning on names (pure) -----------------------------------------------------------------------
def test_plan_select_full_layers_exclusions_and_nesting():
    tree = Tree.from_names(NAMES)
    rules, excl = RecomputeConfig(mode="select", select={"core_attention": "0-1", ".*mlp.*act": True},
                                  full_layers=[1, 3], exclude=["layers.3.mlp.act"]).rules()
    rep = resolve(tree, rules, excl)
    assert rep.names == ["decoder.layers.0.self_attention.core_attention", "decoder.layers.0.mlp.act",
                         "decoder.layers.1", "decoder.layers.2.mlp.act",
                         "decoder.layers.3.input_layernorm", "decoder.layers.3.self_attention",
                         "decoder.layers.3.mlp.linear_fc1_gate", "decoder.layers.3.mlp.linear_fc2"]
    skipped = dict(rep.skipped)
    assert skipped["decoder.layers.1.mlp.act"].startswith("inside unit decoder.layers.1")
    assert "excluded by exclude 'layers.3.mlp.act'" in skipped["decoder.layers.3.mlp.act"]
    assert any("decoder.layers.3 split into 4 unit(s)" in n for n in rep.notes)
    assert [u.layer for u in rep.units] == [0, 0, 1, 2, 3, 3, 3, 3]
    assert "decoder.layers.1" in str(rep) and "full_layers=[1, 3]" in str(rep)


def test_plan_full_stage_and_missing_layers():
    tree = Tree.from_names(NAMES)
    rep = resolve(tree, *RecomputeConfig(mode="full", granularity="stage").rules())
    assert rep.names == ["decoder"]
    rep = resolve(tree, *RecomputeConfig(mode="full", layers="2,7").rules())
    assert rep.names == ["decoder.layers.2"]
    rep = resolve(tree, *RecomputeConfig(mode="full", layers="8-9").rules())
    assert rep.names == [] and "holds layers 0-3" in rep.notes[0]
    with pytest.raises(PatternError, match="has no transformer layers"):
        resolve(Tree.from_names(["a", "a.b"]), *RecomputeConfig(mode="full").rules())
    # a name that exists but outside the chosen layers is a note, not an error (another stage has it)
    rep = resolve(tree, *RecomputeConfig(mode="select", select=["mlp.act"], layers="9").rules())
    assert rep.names == [] and "matches 4 Cell(s), none in layers 9" in rep.notes[0]


def test_pattern_matching_nothing_is_an_error_with_close_names():
    model = GPTModel(tiny())
    with pytest.raises(PatternError) as err:
        plan_recompute(model, ["layers.*.attention.core_attention"])
    msg = str(err.value)
    assert "'layers.*.attention.core_attention' (read as a glob) matches no Cell of GPTModel" in msg
    assert "layers.*.self_attention.core_attention" in msg and "inline in a construct" in msg
    with pytest.raises(PatternError, match="exclude pattern 'nothing_here'"):
        plan_recompute(model, RecomputeConfig(mode="full", exclude=["nothing_here"]))
    assert plan_recompute(model, RecomputeConfig(select=["nothing_here"], strict=False)).names == []


# ---- MindFormers YAML (pure) ---------------------------------------------------------------------------
PP2 = StageMap((range(0, 2), range(2, 4)), 2)


def test_mindformers_recompute_config_translation():
    cfg = from_mindformers({"recompute": True}, PP2)
    assert cfg.mode == "full" and layers_of(cfg.layers).all
    cfg = from_mindformers({"recompute": [1, 2], "select_recompute": True}, PP2)
    assert cfg.mode == "select" and sorted(cfg.full_layers) == [0, 2, 3]
    assert cfg.select == {r"re:(?:.*\.)?layers\.\d+\.mlp\.act": "all"}
    rep = resolve(Tree.from_names(NAMES), *cfg.rules())
    assert rep.names == ["decoder.layers.0", "decoder.layers.1.mlp.act", "decoder.layers.2", "decoder.layers.3"]
    cfg = from_mindformers({"select_recompute": {r"feed_forward\.w1\.matmul": [1, 0], r"attention\.wq": True},
                            "select_comm_recompute": True,
                            "select_recompute_exclude": [r"feed_forward\.w3\.matmul"]}, PP2)
    rep = resolve(Tree.from_names(NAMES), *cfg.rules(), strict=False)
    assert rep.names == ["decoder.layers.0.input_layernorm", "decoder.layers.0.self_attention.linear_q",
                         "decoder.layers.0.mlp.linear_fc1_gate"] + [
        f"decoder.layers.{i}.{n}" for i in (1, 2, 3) for n in ("input_layernorm", "self_attention.linear_q")]
    assert any("'feed_forward\\\\.w1\\\\.matmul' -> 'mlp\\\\.linear_fc1_gate'" in n and "whole Cell" in n
               for n in cfg.notes), cfg.notes
    assert any("no communication operators" in n for n in cfg.notes)
    assert translate_mindformers(r"mlp\.act") == (r"mlp\.act", "")   # our own names pass through
    # with swap on, MindFormers reads layer lists as layer indices
    cfg = from_mindformers({"recompute": [3]}, PP2, swap_config={"swap": True})
    assert cfg.layers == [3]
    # per pipeline rank with 2 virtual stages: spread over the rank's chunks like MindFormers
    vpp = StageMap((range(0, 1), range(1, 2), range(2, 3), range(3, 4)), 2)
    assert from_mindformers({"recompute": [2, 1]}, vpp).layers == [0, 1, 2]
    with pytest.raises(PatternError, match=r"unknown key\(s\) \['recomput'\]"):
        from_mindformers({"recomput": True}, PP2)
    with pytest.raises(PatternError, match=r"recompute_config.recompute=\[1, 1, 1\]: give one count per "
                                           r"pipeline stage \(2\)"):
        from_mindformers({"recompute": [1, 1, 1]}, PP2)


def test_mindformers_swap_config_translation():
    assert swap_from_mindformers({"swap": False}) is None
    cfg = swap_from_mindformers({"swap": True})
    assert resolve(Tree.from_names(NAMES), *cfg.rules()).names == [
        f"decoder.layers.{i}.self_attention.core_attention" for i in range(4)]
    cfg = swap_from_mindformers({"swap": True, "layer_swap": [{"backward_prefetch": 20, "layers": [0, 3]}],
                                 "op_swap": [{"op_name": "feed_forward", "backward_prefetch": 21, "layers": [1]}]})
    assert resolve(Tree.from_names(NAMES), *cfg.rules()).names == ["decoder.layers.0", "decoder.layers.1.mlp",
                                                                    "decoder.layers.3"]
    assert cfg.prefetch == {"default": 1, "layer_swap[0]": 20, "op_swap['feed_forward']": 21}
    cfg = swap_from_mindformers({"swap": True, "op_swap": {r"attention": [{"layers": True, "backward_prefetch": 2}]}})
    assert len(resolve(Tree.from_names(NAMES), *cfg.rules()).names) == 4
    with pytest.raises(PatternError, match=r"op_swap\[0\]=.*expected \{op_name"):
        swap_from_mindformers({"swap": True, "op_swap": [{"layers": True}]})


# ---- on a real model (PyNative) -------------------------------------------------------------------------
def _grads(setup, drop=0.0, jit=False, steps=1):
    ms.set_seed(3)
    model = GPTModel(tiny(hidden_dropout=drop, attention_dropout=drop))
    model.set_train(True)
    setup(model)
    fn = ms.value_and_grad(model, None, model.trainable_params())
    fn = ms.jit(fn) if jit else fn
    ids, labels = batch()
    out = []
    for _ in range(steps):
        loss, grads = fn(ids, labels)
        out.append((float(loss.asnumpy()), [g.asnumpy() for g in grads]))
    return out


def _assert_same(a, b, tol=0.0, what=""):
    for (la, ga), (lb, gb) in zip(a, b):
        assert abs(la - lb) <= tol * abs(lb), (what, la, lb)
        for x, y in zip(ga, gb):
            err = np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)
            assert err <= tol, f"{what}: gradient relative error {err:.2e}"


SETUPS = {
    "select": lambda m: apply_recompute(m, "select"),
    "select_patterns": lambda m: apply_recompute(m, RecomputeConfig(
        select=["layers.*.self_attention.core_attention", ".*mlp.*act"], layers="1")),
    "full": lambda m: apply_recompute(m, "full"),
    "stage": lambda m: apply_recompute(m, RecomputeConfig(mode="full", granularity="stage")),
    "mindformers": lambda m: apply_recompute(m, {"recompute": [1], "select_recompute": True,
                                                 "select_comm_recompute": True}),
    "swap_ops": lambda m: apply_swap(m, ["core_attention", "mlp.act", "linear_q"]),
    "swap_layers_and_recompute": lambda m: (apply_recompute(m, ["mlp.act"]), apply_swap(m, SwapConfig(layers="0"))),
}


@pytest.fixture(scope="module")
def plain():
    return {drop: _grads(lambda m: None, drop, steps=2) for drop in (0.0, 0.1)}


# bit-exact except where a recomputed Cell's input gradient is summed with another branch's in a
# different order (recomputed norms on the residual stream: ~2e-7 relative)
TOLERANCE = {"mindformers": 1e-6}


@pytest.mark.parametrize("name", list(SETUPS))
def test_pynative_parity_loss_and_every_gradient(plain, name):
    _assert_same(_grads(SETUPS[name]), plain[0.0][:1], TOLERANCE.get(name, 0.0), name)


def test_exclusion_split_parity_within_1e6(plain):
    got = _grads(lambda m: apply_recompute(m, RecomputeConfig(mode="full", exclude=["core_attention"])))
    _assert_same(got, plain[0.0][:1], 1e-6, "full minus core_attention")


@pytest.mark.parametrize("name", ["select", "full", "stage", "swap_ops"])
def test_dropout_rng_replayed_in_recompute(plain, name):
    """Dropout 0.1 everywhere: the recomputed masks equal the forward's, and the random state after
    the step equals the one without recompute (the second step's masks agree too)."""
    _assert_same(_grads(SETUPS[name], drop=0.1, steps=2), plain[0.1], 0.0, f"{name} with dropout")


def test_apply_keeps_names_tree_and_parameters():
    model = GPTModel(tiny())
    params = [p.name for p in model.get_parameters()]
    cells = [n for n, _ in model.cells_and_names()]
    rep = apply_recompute(model, RecomputeConfig(select=["core_attention"], full_layers="1"))
    rep2 = apply_swap(model, ["mlp.act", "linear_q"])
    assert [p.name for p in model.get_parameters()] == params
    assert [n for n, _ in model.cells_and_names()] == cells
    assert rep.names == ["decoder.layers.0.self_attention.core_attention", "decoder.layers.1"]
    assert rep2.names == ["decoder.layers.0.self_attention.linear_q", "decoder.layers.0.mlp.act"]
    assert "inside recompute unit decoder.layers.1" in dict(rep2.skipped)["decoder.layers.1.mlp.act"]
    with pytest.raises(ValueError, match="already a recompute unit"):
        apply_recompute(model, ["core_attention"])


def test_pipeline_stage_uses_global_layer_ids_and_mindformers_counts():
    cfg = tiny(num_layers=4, pipeline_model_parallel_size=2)
    last = GPTModel(cfg, pp_rank=1)             # holds layers 2-3 as decoder.layers.0/1
    assert model_tree(last).layers == {"decoder.layers.0": 2, "decoder.layers.1": 3}
    assert plan_recompute(last, RecomputeConfig(mode="full", layers="1-2")).names == ["decoder.layers.0"]
    rep = plan_recompute(last, {"recompute": [2, 1], "select_recompute": [0, 2]})
    assert rep.names == ["decoder.layers.0", "decoder.layers.1.mlp.act"]
    assert plan_swap(last, {"swap": True, "layer_swap": [{"layers": [3], "backward_prefetch": 1}]}).names == \
        ["decoder.layers.1"]
    stage = PipelineStage(last, 1, 2, loss_fn=VocabParallelCrossEntropy())
    assert apply_recompute(stage, RecomputeConfig(mode="full", granularity="stage")).names == ["decoder"]


def test_meter_saved_bytes_recompute_counts_and_host_copies():
    ids, labels = batch()

    def measure(setup):
        ms.set_seed(3)
        model = GPTModel(tiny())
        setup(model)
        meter = ActivationMeter(model)
        return meter.measure(model, ids, labels, weights=model.trainable_params()), meter

    none, _ = measure(lambda m: None)
    select, ms_select = measure(SETUPS["select"])
    full, ms_full = measure(SETUPS["full"])
    swap, ms_swap = measure(SETUPS["swap_ops"])
    assert none["held_after_forward"] > select["held_after_forward"] > full["held_after_forward"] > 0
    assert full["peak"] > full["held_after_forward"]            # one layer's activations come back in backward
    assert dict(ms_select.recomputed) == {f"decoder.layers.{i}.{n}": 1 for i in (0, 1)
                                          for n in ("self_attention.core_attention", "mlp.act")}
    assert dict(ms_full.recomputed) == {"decoder.layers.0": 1, "decoder.layers.1": 1}
    assert swap["host_after_forward"] > 0
    assert swap["held_after_forward"] + swap["host_after_forward"] >= none["held_after_forward"]
    assert none["held_after_forward"] - swap["held_after_forward"] > 0.5 * swap["host_after_forward"]
    assert set(ms_swap.swapped) == {f"decoder.layers.{i}.{n}" for i in (0, 1)
                                    for n in ("self_attention.core_attention", "mlp.act",
                                              "self_attention.linear_q")}


# ---- ms.jit -------------------------------------------------------------------------------------------------------
def test_jit_parity_with_dropout():
    """Under ms.jit the compiler's recompute pass does the work; with dropout 0.1 the loss and all
    gradients equal those without recompute (swap compiles to MindSpore's graph offload, a no-op on CPU)."""
    base = _grads(lambda m: None, drop=0.1, jit=True)
    for name in ("select_patterns", "full", "swap_layers_and_recompute"):
        _assert_same(_grads(SETUPS[name], drop=0.1, jit=True), base, 1e-6, f"jit {name}")


def test_a_layer_wrapped_by_parallelize_can_be_a_recompute_unit():
    """parallelize wraps a Cell whose boundary redistributes in a ShardedCall (an MTP layer under sequence
    parallel, issue 32); MindSpore's Cell.recompute asked the wrapper hasattr('_recompute_cell') and got the
    inner Cell's answer, refusing the unit. The wrapped unit recomputes and gives the same loss and gradients."""
    from mindspore import nn
    from mindformers_core.recompute.units import set_recompute
    from mindformers_core.sharding.boundary import Passthrough, ShardedCall
    ms.set_seed(0)
    x = Tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))

    def loss_and_grads(recompute):
        ms.set_seed(1)
        inner = nn.Dense(8, 8)
        cell = ShardedCall(inner, [Passthrough()], [Passthrough()], True)
        if recompute:
            set_recompute(cell, "layer")
        fn = ms.value_and_grad(lambda v: (cell(v) ** 2).sum(), None, cell.trainable_params())
        loss, grads = fn(x)
        return float(loss), [g.asnumpy() for g in grads]

    plain, recomputed = loss_and_grads(False), loss_and_grads(True)
    assert recomputed[0] == plain[0]
    for a, b in zip(recomputed[1], plain[1]):
        np.testing.assert_array_equal(a, b)
