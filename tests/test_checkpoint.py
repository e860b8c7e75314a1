"""Distributed checkpoints in one process: N ranks simulated by slicing global arrays with each
rank's layout slice, saved, then loaded into other layouts / world sizes and compared exactly."""
import json
import os
import threading

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open

from mindformers_core.checkpoint import (CheckpointError, TRACKER, checkpoint_specs, finalize_checkpoint,
                                         layout_from_dict, layout_to_dict, list_steps, load_checkpoint,
                                         load_optimizer_state, load_single_file, load_training_state,
                                         merge_to_single_file, read_tracker, save_checkpoint,
                                         shard_single_file, write_shards)
from mindformers_core.checkpoint import reshard as reshard_mod
from mindformers_core.checkpoint import save as save_mod
from mindformers_core.sharding import Layout

MESH = Layout((2, 2), ("dp", "tp"))
RNG = np.random.default_rng(0)
GLOBALS = {
    "embedding.weight": RNG.standard_normal((16, 8)).astype(np.float32),
    "layers.0.attention.wq": RNG.standard_normal((8, 12)).astype(np.float32),
    "layers.0.attention.wo": RNG.standard_normal((12, 8)).astype(np.float32),
    "layers.0.norm.weight": RNG.standard_normal((8,)).astype(np.float32),
    "head.bias": RNG.standard_normal((12,)).astype(np.float32),
}
DP2TP2 = {
    "embedding.weight": MESH(("dp", "tp"), "None"),      # split over all 4 ranks
    "layers.0.attention.wq": MESH("None", "tp"),        # replicated over dp
    "layers.0.attention.wo": MESH("tp", "None"),
    "layers.0.norm.weight": None,                        # replicated everywhere
    "head.bias": MESH("tp"),
}


def local(arr, layout, rank):
    return arr if layout is None else arr[layout.local_slice(arr.shape, rank)]


def simulate_save(directory, step, layouts=DP2TP2, world=4, values=GLOBALS, optimizer=True):
    """write_shards on every simulated rank, then finalize (what save_checkpoint does with a barrier)."""
    for r in range(world):
        params = {n: local(values[n], layouts[n], r) for n in values}
        opt = {"exp_avg": {n: v * 2 for n, v in params.items()},
               "exp_avg_sq": {n: v * v for n, v in params.items()}} if optimizer else None
        write_shards(directory, step, params, layouts, optimizer_state=opt, rank=r, world_size=world,
                     data_state={"rank": r, "consumed": 100 * step}, trainer_state={"step": step, "seed": 7})
    return finalize_checkpoint(directory, step, world)


def targets_for(layouts):
    return {n: (GLOBALS[n].shape, layouts[n]) for n in GLOBALS}


def assert_loads(directory, layouts, ranks, values=GLOBALS):
    for r in ranks:
        out = load_checkpoint(str(directory), targets_for(layouts), r)
        held = {n for n, lay in layouts.items() if lay is None or r in lay.rank_list}
        assert set(out) == held
        for n in held:
            np.testing.assert_array_equal(out[n], local(values[n], layouts[n], r), err_msg=f"rank {r} {n}")


# ---- resharding -----------------------------------------------------------------------------
def test_dp2tp2_loads_into_tp4_one_process_and_other_meshes(tmp_path):
    simulate_save(tmp_path, 10)
    tp4 = Layout((4,), ("tp",))
    assert_loads(tmp_path, {"embedding.weight": tp4("tp", "None"), "layers.0.attention.wq": tp4("None", "tp"),
                            "layers.0.attention.wo": tp4("tp", "None"), "layers.0.norm.weight": tp4("tp"),
                            "head.bias": tp4("tp")}, range(4))
    full = load_checkpoint(str(tmp_path), checkpoint_specs(str(tmp_path)))
    assert sorted(full) == sorted(GLOBALS)
    for n in GLOBALS:
        np.testing.assert_array_equal(full[n], GLOBALS[n])
    m42 = Layout((4, 2), ("dp", "tp"))                 # 8 ranks, transposed and nested splits
    assert_loads(tmp_path, {"embedding.weight": m42("tp", "dp"), "layers.0.attention.wq": m42("tp", ("dp",)),
                            "layers.0.attention.wo": m42("None", ("tp", "dp")), "layers.0.norm.weight": m42("dp"),
                            "head.bias": m42("dp")}, range(8))


def test_dp2tp2_loads_into_pp2_stages(tmp_path):
    simulate_save(tmp_path, 1)
    s0, s1 = Layout((2,), ("tp",), rank_list=[0, 1]), Layout((2,), ("tp",), rank_list=[2, 3])
    layouts = {"embedding.weight": s0("tp", "None"), "layers.0.attention.wq": s0("None", "tp"),
               "layers.0.attention.wo": s1("tp", "None"), "layers.0.norm.weight": s1("None"),
               "head.bias": None}
    assert_loads(tmp_path, layouts, range(4))
    assert set(load_checkpoint(str(tmp_path), targets_for(layouts), 3)) == {
        "layers.0.attention.wo", "layers.0.norm.weight", "head.bias"}


def test_dtypes_scalars_and_mindspore_inputs_round_trip(tmp_path):
    tp2 = Layout((2,), ("tp",))
    bf16 = ms.Tensor(RNG.standard_normal((4, 6)).astype(np.float32)).astype(ms.bfloat16)
    values = {"bf": bf16.asnumpy(), "ids": np.arange(12, dtype=np.int64).reshape(6, 2),
              "scale": np.array(3.5, np.float32), "mask": np.array([True, False, True, True])}
    layouts = {"bf": tp2("None", "tp"), "ids": tp2("tp", "None"), "scale": None, "mask": tp2("tp")}
    for r in range(2):
        params = {n: local(v, layouts[n], r) for n, v in values.items()}
        params["bf"] = ms.Parameter(ms.Tensor(params["bf"]), name="bf")   # Parameter input, bf16
        write_shards(str(tmp_path), 5, params, layouts, rank=r, world_size=2)
    finalize_checkpoint(str(tmp_path), 5, 2)
    full = load_checkpoint(str(tmp_path), {n: (v.shape, None, v.dtype) for n, v in values.items()})
    for n, v in values.items():
        assert full[n].dtype == v.dtype and full[n].shape == v.shape
        np.testing.assert_array_equal(full[n].astype(np.float32), v.astype(np.float32))
    back = load_checkpoint(str(tmp_path), {"bf": ((4, 6), Layout((2,), ("x",))("x", "None"), ms.bfloat16),
                                           "ids": ((6, 2), None), "scale": ((), None), "mask": ((4,), None)}, 1)
    np.testing.assert_array_equal(back["bf"].astype(np.float32), values["bf"][2:].astype(np.float32))


def test_mindspore_layout_accepted_and_layout_dict_round_trip(tmp_path):
    from mindspore.parallel import Layout as MsLayout
    for lay in [MESH(("dp", "tp"), "None"), MESH("None", "tp"), Layout((2,), ("tp",), rank_list=[2, 3])("tp"),
                Layout((2, 2, 2), ("pp", "dp", "tp"))("tp", ("dp",), "None")]:
        assert layout_from_dict(json.loads(json.dumps(layout_to_dict(lay)))) == lay
    simulate_save(tmp_path, 1)
    ms_tp4 = MsLayout((4,), ("tp",))("tp", "None")
    out = load_checkpoint(str(tmp_path), {**targets_for({n: None for n in GLOBALS}),
                                          "embedding.weight": ((16, 8), ms_tp4)}, 2)
    np.testing.assert_array_equal(out["embedding.weight"], GLOBALS["embedding.weight"][8:12])


# ---- optimizer, data and trainer state ------------------------------------------------------
def test_optimizer_data_and_trainer_state_round_trip(tmp_path):
    simulate_save(tmp_path, 20)
    tp4 = Layout((4,), ("tp",))
    layouts = {n: (tp4("tp", "None") if v.ndim == 2 else None) for n, v in GLOBALS.items()}
    for r in range(4):
        opt = load_optimizer_state(str(tmp_path), targets_for(layouts), r)
        assert sorted(opt) == ["exp_avg", "exp_avg_sq"]
        for n, v in GLOBALS.items():
            np.testing.assert_array_equal(opt["exp_avg"][n], local(v, layouts[n], r) * 2)
            np.testing.assert_array_equal(opt["exp_avg_sq"][n], local(v, layouts[n], r) ** 2)
    state = load_training_state(str(tmp_path))
    assert (state.step, state.world_size, state.trainer_state) == (20, 4, {"step": 20, "seed": 7})
    assert state.data_states == {r: {"rank": r, "consumed": 2000} for r in range(4)}
    # frozen parameters have no moments; moments of a parameter not targeted are "unexpected"
    few = {n: t for n, t in targets_for(layouts).items() if n != "head.bias"}
    with pytest.raises(CheckpointError, match="optimizer/exp_avg/head.bias"):
        load_optimizer_state(str(tmp_path), few, 0)
    assert "head.bias" not in load_optimizer_state(str(tmp_path), few, 0, strict=False)["exp_avg"]


# ---- replicated slices written once ---------------------------------------------------------
def test_replicated_slices_are_written_once(tmp_path):
    step = simulate_save(tmp_path, 1, optimizer=False)
    keys = {}
    for r in range(4):
        with safe_open(os.path.join(step, f"rank_{r}.safetensors"), framework="np") as f:
            keys[r] = sorted(f.keys())
    assert keys[0] == sorted(["embedding.weight", "layers.0.attention.wq", "layers.0.attention.wo",
                              "layers.0.norm.weight", "head.bias"])
    assert keys[1] == ["embedding.weight", "head.bias", "layers.0.attention.wo", "layers.0.attention.wq"]
    assert keys[2] == keys[3] == ["embedding.weight"]             # dp replica 1 holds copies only
    saved = 0
    for r in range(4):
        with safe_open(os.path.join(step, f"rank_{r}.safetensors"), framework="np") as f:
            saved += sum(f.get_tensor(k).size for k in f.keys())
    assert saved == sum(v.size for v in GLOBALS.values())           # no duplicated element
    rec = json.load(open(os.path.join(step, "rank_3.json")))["tensors"]["layers.0.attention.wq"]
    assert (rec["written"], rec["writer"], rec["slice"]) == (False, 1, [[0, 8], [6, 12]])
    assert rec["layout"]["tensor_map"] == [-1, 0] and rec["global_shape"] == [8, 12]


# ---- atomicity ------------------------------------------------------------------------------
def test_crash_before_rename_keeps_previous_step_latest(tmp_path, monkeypatch):
    d = str(tmp_path)
    simulate_save(d, 1)
    changed = {n: v + 1 for n, v in GLOBALS.items()}
    real_replace = os.replace

    def crash(src, dst):
        if src.endswith("step_2.tmp"):
            raise KeyboardInterrupt("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(save_mod.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        simulate_save(d, 2, values=changed)
    monkeypatch.setattr(save_mod.os, "replace", real_replace)
    assert read_tracker(d) == 1 and list_steps(d) == [1]
    assert not os.path.exists(os.path.join(d, "step_2")) and os.path.isdir(os.path.join(d, "step_2.tmp"))
    assert_loads(d, DP2TP2, range(4))                               # latest is still step 1
    # a crash while ranks write (rank 3 never wrote): finalize refuses, nothing is published
    for r in range(3):
        write_shards(d, 3, {n: local(changed[n], DP2TP2[n], r) for n in GLOBALS}, DP2TP2, rank=r, world_size=4)
    with pytest.raises(CheckpointError, match=r"rank_3\.json: file is missing"):
        finalize_checkpoint(d, 3, 4)
    assert read_tracker(d) == 1 and list_steps(d) == [1]
    # retrying step 2 over its stale staging directory works
    simulate_save(d, 2, values=changed)
    assert read_tracker(d) == 2 and list_steps(d) == [1, 2]
    assert_loads(d, DP2TP2, range(4), values=changed)
    np.testing.assert_array_equal(load_checkpoint(d, targets_for(DP2TP2), 0, step=1)["head.bias"],
                                  GLOBALS["head.bias"][:6])


def _threaded_save(d, step, world, make_params, layouts):
    """Real save_checkpoint on `world` threads that share a threading.Barrier."""
    bar = threading.Barrier(world, timeout=30)
    results = {}

    def run(r):
        try:
            results[r] = save_checkpoint(d, step, make_params(r), layouts, rank=r, world_size=world,
                                         barrier=bar.wait, trainer_state={"step": step})
        except Exception as e:   # noqa: BLE001 - reported per rank
            results[r] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def test_save_checkpoint_with_barrier_and_a_failing_rank(tmp_path):
    d = str(tmp_path)
    ok = _threaded_save(d, 4, 4, lambda r: {n: local(GLOBALS[n], DP2TP2[n], r) for n in GLOBALS}, DP2TP2)
    assert all(v == os.path.join(d, "step_4") for v in ok.values()), ok
    assert_loads(d, DP2TP2, range(4))

    def bad_on_2(r):
        params = {n: local(GLOBALS[n], DP2TP2[n], r) for n in GLOBALS}
        if r == 2:
            params["head.bias"] = object()
        return params
    failed = _threaded_save(d, 5, 4, bad_on_2, DP2TP2)
    assert isinstance(failed[2], TypeError)
    assert isinstance(failed[0], CheckpointError) and "rank_2.failed" in str(failed[0])
    assert all(isinstance(failed[r], CheckpointError) for r in (1, 3))
    assert read_tracker(d) == 4 and list_steps(d) == [4]


def test_single_process_save_with_parameters(tmp_path):
    params = {n: ms.Parameter(ms.Tensor(v), name=n) for n, v in GLOBALS.items()}
    path = save_checkpoint(str(tmp_path), 0, params, rank=0, world_size=1)
    assert sorted(os.listdir(path)) == ["metadata.json", "rank_0.json", "rank_0.safetensors"]
    assert open(os.path.join(tmp_path, TRACKER)).read().strip() == "0"
    assert_loads(tmp_path, DP2TP2, range(4))


# ---- conversion -----------------------------------------------------------------------------
def test_merge_and_shard_single_file(tmp_path):
    simulate_save(tmp_path / "ck", 3)
    out = merge_to_single_file(str(tmp_path / "ck"), str(tmp_path / "full"))
    assert out.endswith("full.safetensors")
    full = load_single_file(out)
    assert sorted(full) == sorted(GLOBALS)
    for n in GLOBALS:
        np.testing.assert_array_equal(full[n], GLOBALS[n])
    assert sorted(ms.load_checkpoint(out, format="safetensors")) == sorted(GLOBALS)   # MindSpore reads it
    tp4 = Layout((4,), ("tp",))
    layouts = {n: tp4("tp", *(["None"] * (v.ndim - 1))) for n, v in GLOBALS.items()}
    for r in range(4):
        part = shard_single_file(out, targets_for(layouts), r)
        for n in GLOBALS:
            np.testing.assert_array_equal(part[n], local(GLOBALS[n], layouts[n], r))
    with_opt = merge_to_single_file(str(tmp_path / "ck"), str(tmp_path / "opt.safetensors"), include_optimizer=True)
    assert "optimizer/exp_avg/head.bias" in load_single_file(with_opt)
    assert sorted(shard_single_file(with_opt, targets_for(layouts), 0)) == sorted(GLOBALS)


# ---- errors ---------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    simulate_save(tmp_path, 7)
    return tmp_path, os.path.join(tmp_path, "step_7")


def _error(directory, targets=None, rank=0, **kw):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(directory), targets or targets_for(DP2TP2), rank, **kw)
    return info.value


def test_missing_shard_file_names_file_and_tensor_and_reads_nothing(saved, monkeypatch):
    d, step = saved
    os.remove(os.path.join(step, "rank_1.safetensors"))
    monkeypatch.setattr(reshard_mod, "safe_open", lambda *a, **k: pytest.fail("data read before validation"))
    e = _error(d, rank=1)
    assert e.file == "rank_1.safetensors" and "file is missing" in str(e)
    assert e.tensor in ("head.bias", "layers.0.attention.wq", "layers.0.attention.wo", "embedding.weight")
    monkeypatch.undo()
    assert set(load_checkpoint(str(d), targets_for(DP2TP2), 2))   # rank 2 needs no shard of rank_1


def test_missing_rank_json_and_uncovered_slice(saved):
    d, step = saved
    os.remove(os.path.join(step, "rank_1.json"))
    e = _error(d, rank=1)
    assert any(p.file == "rank_1.json" and "file is missing" in p.what for p in e.problems)
    gap = [p for p in e.problems if p.tensor == "head.bias" and "do not cover" in p.what]
    assert gap and "global elements [6:12]" in gap[0].expected


def test_missing_and_unexpected_tensors_with_closest_names(saved):
    d, _ = saved
    targets = targets_for(DP2TP2)
    targets["layers.0.attention.wk"] = ((8, 12), None)
    e = _error(d, targets)
    assert e.tensor == "layers.0.attention.wk" and "missing from the checkpoint" in str(e)
    assert "layers.0.attention.wq" in e.found
    del targets["layers.0.attention.wk"]
    del targets["head.bias"]
    e = _error(d, targets)
    assert e.tensor == "head.bias" and "unexpected tensor" in str(e) and "strict=False" in str(e)
    assert set(load_checkpoint(str(d), targets, 0, strict=False)) == set(targets)


def test_different_model_lists_closest_names(saved):
    d, _ = saved
    renamed = {n.replace("layers.0", "model.layers.0"): t for n, t in targets_for(DP2TP2).items()}
    e = _error(d, renamed)
    missing = {p.tensor: p.found for p in e.problems if "missing" in p.what}
    assert set(missing) == {"model.layers.0.attention.wq", "model.layers.0.attention.wo",
                            "model.layers.0.norm.weight"}
    assert "'layers.0.attention.wq'" in missing["model.layers.0.attention.wq"]
    assert sum("unexpected" in p.what for p in e.problems) == 3


def test_shape_and_dtype_mismatch(saved):
    d, _ = saved
    targets = targets_for(DP2TP2)
    targets["head.bias"] = ((16,), None)
    e = _error(d, targets)
    assert (e.tensor, e.expected, e.found) == ("head.bias", "[16]", "[12]") and "global shape mismatch" in str(e)
    targets["head.bias"] = ((12,), None, np.float16)
    e = _error(d, targets)
    assert (e.tensor, e.expected, e.found) == ("head.bias", "float16", "float32") and "dtype mismatch" in str(e)
    targets["head.bias"] = ((12,), None, ms.float32)
    assert load_checkpoint(str(d), targets, 0)["head.bias"].dtype == np.float32


def test_corrupt_files(saved):
    d, step = saved
    path = os.path.join(step, "rank_0.safetensors")
    data = open(path, "rb").read()
    os.chmod(path, 0o600)
    open(path, "wb").write(data[:-10])
    e = _error(d)
    assert e.file == "rank_0.safetensors" and "corrupt safetensors file" in str(e) and "SafetensorError" in e.found
    open(path, "wb").write(data)
    open(os.path.join(step, "rank_2.json"), "w").write('{"rank": 2, "tensors": {')
    e = _error(d)
    assert e.file == "rank_2.json" and "corrupt JSON" in str(e)
    open(os.path.join(step, "metadata.json"), "w").write("[]")
    e = _error(d)
    assert e.file == "metadata.json"
    open(os.path.join(d, TRACKER), "w").write("seven")
    e = _error(d)
    assert e.file == TRACKER and "'seven'" in e.found
    e = _error(os.path.join(d, "nowhere"))
    assert "no checkpoint here" in str(e)


def test_save_errors_before_writing(tmp_path):
    d = str(tmp_path)
    w = GLOBALS["head.bias"]
    with pytest.raises(ValueError, match="partial layout"):
        write_shards(d, 1, {"b": w}, {"b": Layout((2,), ("tp",))("None").with_partial("tp")}, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"rank_list \[2, 3\] does not include"):
        write_shards(d, 1, {"b": w}, {"b": Layout((2,), ("tp",), rank_list=[2, 3])("tp")}, rank=0, world_size=4)
    with pytest.raises(ValueError, match="not in params"):
        write_shards(d, 1, {"b": w}, optimizer_state={"m": {"c": w}})
    with pytest.raises(ValueError, match="local shape"):
        write_shards(d, 1, {"b": w}, optimizer_state={"m": {"b": w[:3]}})
    with pytest.raises(ValueError, match="not JSON-serializable"):
        write_shards(d, 1, {"b": w}, data_state={"x": object()})
    assert not os.listdir(d)


def test_tensor_on_some_ranks_without_rank_list_is_not_published(tmp_path):
    d = str(tmp_path)
    for r in range(2):
        params = {"b": local(GLOBALS["head.bias"], MESH("tp"), r)}
        if r == 1:
            params["final_norm"] = GLOBALS["layers.0.norm.weight"]   # only rank 1 holds it, layout None
        write_shards(d, 1, params, {"b": Layout((2,), ("tp",))("tp")}, rank=r, world_size=2)
    with pytest.raises(CheckpointError) as info:
        finalize_checkpoint(d, 1, 2)
    assert info.value.tensor == "final_norm" and "rank_list" in info.value.found
    assert list_steps(d) == [] and read_tracker(d) is None
