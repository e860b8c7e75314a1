"""Expert-parallel MoE GPT under msrun equals one process: losses of 2 momentum-SGD steps and the
final weights (dense and expert) merged from every rank's shards (relative 1e-5), in PyNative and
under ms.jit, dropless routing. 2 ranks: ep2 (softmax top-2) and ep2 with sigmoid scores and
group-limited routing; 4 ranks: ep4, ep2 x dp2 (expert gradients summed over the expert-data-parallel
group only; the load-balancing loss over the whole global batch), ep2 x tp2 (dense layers tensor
parallel, experts replicated over tp). The routing variant runs under jit only (ep2 proves both modes).
Checkpoints across ep sizes (4 ranks): ep1 -> ep2 -> ep4 and ep2 -> one process, weights and expert bias exact;
the trainer's ep2 run resumes with its saved expert bias (= the uninterrupted run)."""
import os
import tempfile

import numpy as np
import pytest

from tests.msrun_batch import computed_ahead, job
from tests.bodies.moe_body import BATCH, SEQ, STEPS, reference
from tests.test_gpt_tp_msrun import _check, _merge

pytestmark = pytest.mark.msrun
BATCH_TOKENS = BATCH * SEQ
EP2 = job("moe_ep2", 2, "tests.bodies.moe_body:run",
          # ep2: PyNative's variable-count exchange and jit's graph-mode one; the routing variant on jit's padded
          # path (jit_variable False); expert 3 never chosen (rank 1's second expert computes only its sentinel)
          {"configs": {"ep2": {"dp": 2, "ep": 2},
                       "ep2_sigmoid_groups": {"dp": 2, "ep": 2, "group": True, "modes": ["jit"],
                                              "jit_variable": False},
                       "ep2_dead_expert": {"dp": 2, "ep": 2, "dead_expert": 3, "modes": ["jit"]}}},
          timeout=600, group=__name__)
# the variable-count all-to-all alone: uneven counts, a zero-count chunk, a rank that receives nothing
A2AV_CASES = [[[2, 3], [0, 1]], [[0, 4], [0, 2]]]
A2AV = job("all_to_all_v", 2, "tests.bodies.moe_body:run_all_to_all_v", {"cases": A2AV_CASES}, timeout=300,
           group=__name__)
EP4 = job("moe_ep4", 4, "tests.bodies.moe_body:run",
          # ep4 in both modes (PyNative: the variable-count exchange over 4 ranks; jit: the padded one); ep2 x dp2
          # PyNative (the variable-count exchange on an ep subgroup); ep2 x tp2 (the dense tp composition) PyNative
          # (ep alone and MoE under tp2 + SP are proven under jit by the ep4 row and the feature grid's cells)
          {"configs": {"ep4": {"dp": 4, "ep": 4},
                       "ep2_dp2_global_aux": {"dp": 4, "ep": 2, "balance": "aux_loss", "modes": ["pynative"]},
                       "ep2_tp2": {"dp": 2, "ep": 2, "tp": 2, "modes": ["pynative"]}}}, timeout=900, group=__name__)


# the YAML trainer (run_mindformer.py) on the tiny Llama made MoE by overrides, ep2 on 2 workers
MAX_GRAD_NORM = 0.5
MOE_KEYS = ["--model.model_config.num_experts", 4, "--model.model_config.num_experts_per_tok", 2,
            "--model.model_config.moe_intermediate_size", 64, "--model.model_config.n_shared_experts", 1,
            "--model.model_config.first_k_dense_replace", 1, "--model.model_config.moe_aux_loss_coeff", 0.01,
            "--model.model_config.moe_router_enable_expert_bias", True,
            "--model.model_config.moe_router_bias_update_rate", 0.01,
            "--runner_config.max_steps", 3, "--lr_schedule.warmup_steps", 0,
            # clipping on every step: the global norm must add the experts of every ep rank
            "--runner_config.max_grad_norm", MAX_GRAD_NORM,
            "--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1}]"]
EP2_ARGS = ["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2,
            "--runner_config.batch_size", 2]
ASSETS = os.path.join(tempfile.gettempdir(), f"mfc_moe_trainer_{os.getpid()}")


def _trainer_kwargs(extra=(), prefix="mfc_moe_ep2_", **more):
    from tests.test_trainer import build_assets
    tiny = build_assets(ASSETS)
    return {"yaml": tiny["yaml"], "out_root": tempfile.mkdtemp(prefix=prefix), "argv": MOE_KEYS + EP2_ARGS + list(extra),
            **more}


TRAINER_EP2 = job("moe_trainer_ep2", 2, "tests.bodies.moe_body:run_trainer", _trainer_kwargs, timeout=600,
                  group=__name__)
ACCUMULATE = ["--runner_config.gradient_accumulation_steps", 2]


def _accumulate_kwargs():
    return _trainer_kwargs(ACCUMULATE, "mfc_moe_ep2_acc_", modes=[0])


# jit with accumulation: the gradient graph launched once per micro-step, each micro-step routing other counts
# through the variable-count exchange (MindSpore's own launch: common/graphs.compile_blocking refuses its blocking
# launch for data-dependent shapes, which gave wrong gradients there; docs/config.md, MFC_JIT_BLOCKING)
TRAINER_EP2_ACCUMULATE = job("moe_trainer_ep2_accumulate", 2, "tests.bodies.moe_body:run_trainer", _accumulate_kwargs,
                             timeout=600, group=__name__)


# checkpoints across ep sizes: ep1 (one process, written here at launch) -> ep2 (dp4 = edp2 x ep2) -> saved there
# -> ep4, and the ep2 checkpoint -> one process (in the test)
_CKPT = {}


def _checkpoint_kwargs():
    from tests.bodies.moe_body import ep1_checkpoint
    root = tempfile.mkdtemp(prefix="mfc_moe_ckpt_ep_")
    ep1, ep2 = os.path.join(root, "ep1"), os.path.join(root, "ep2")
    _CKPT["saved"], _CKPT["loss"] = ep1_checkpoint(ep1)
    return {"ep1_dir": ep1, "ep2_dir": ep2}


CHECKPOINT_EP = job("moe_checkpoint_ep", 4, "tests.bodies.moe_body:run_checkpoint_ep", _checkpoint_kwargs,
                    timeout=600, group=__name__)


@computed_ahead
def both_modes():
    return reference()


@pytest.fixture(scope="module")
def single_process():
    return both_modes()


@computed_ahead
def group_routing_jit():
    return reference(("jit",), group=True)


@computed_ahead
def dead_expert_jit():
    return reference(("jit",), dead_expert=3)


@computed_ahead
def global_aux_pynative():
    return reference(modes=("pynative",), balance="aux_loss")


def _uneven_variable_path(results, name, ep, dp, modes=("pynative", "jit")):
    """Both modes ran a variable-count exchange: PyNative's kernel kept the count matrix it read on the host,
    jit's the one its graph exchanged (graph-mode path); the last step routed the same rows in both (the same
    model, data and seed); and the routing really was uneven: per expert and per destination rank (so padded
    chunks would have padding)."""
    for rank, per_rank in enumerate(results):
        seen = []
        for mode, key in (("pynative", "eager"), ("jit", "graph")):
            if mode not in modes:
                continue
            counts = per_rank[f"{name}/{mode}"]["counts"]
            assert len(counts) == 1 and counts[0][key] is not None, (name, mode, rank)
            c = np.array(counts[0][key])
            assert c.shape == (ep, 4) and c.sum() == ep * (BATCH_TOKENS // dp) * 2, c   # every row of the ep group
            per_dest = c.reshape(ep, ep, -1).sum(2)
            assert len(set(c.reshape(-1).tolist())) > 1 and len(set(per_dest.reshape(-1).tolist())) > 1, c
            seen.append(c)
            if mode == "jit":
                # the graph's forward wire rows over the STEPS steps: 2 emulated exchanges of P x N k rows per
                # forward; the off-rank rows it sent include at least the last step's (from its count matrix)
                rows = (BATCH_TOKENS // dp) * 2
                assert counts[0]["buffer_rows"] == STEPS * 2 * ep * rows, counts[0]
                if ep == len(results):              # the ep group is the world: this rank is ep index `rank`
                    last = per_dest[rank].sum() + per_dest[:, rank].sum() - 2 * per_dest[rank, rank]
                    assert 0 < last <= counts[0]["sent_rows"] <= STEPS * 2 * rows, (counts[0], per_dest)
        for c in seen[1:]:
            np.testing.assert_array_equal(c, seen[0])


def test_all_to_all_v_forward_and_backward():
    """Every rank receives, in source order, exactly the rows addressed to it (zero-count chunks and a rank
    that receives nothing included); the gradient is the exchange back with the transposed counts."""
    from mindformers_core.distributed.comm.exchange import emulated_all_to_all_v
    results = A2AV.results()
    for case, matrix in enumerate(A2AV_CASES):
        m = np.array(matrix)
        sends = [r[case]["rows"] for r in results]
        want = emulated_all_to_all_v(sends, m)
        grads = emulated_all_to_all_v([r[case]["weight"] for r in results], m.T)
        for rank, r in enumerate(results):
            assert r[case]["agreed"] == matrix
            np.testing.assert_array_equal(r[case]["received"].reshape(-1, 3), want[rank])
            assert [tuple(x[:2]) for x in want[rank]] == [(j, rank) for j in range(2) for _ in range(m[j, rank])]
            np.testing.assert_array_equal(r[case]["grad"].reshape(-1, 3), grads[rank])


def test_ep2_softmax_and_sigmoid_group_routing(single_process):
    results = EP2.results()
    _check(results, single_process, ["ep2"])
    _uneven_variable_path(results, "ep2", 2, 2)
    ref = group_routing_jit()         # routing variant: one mode (ep2 proves both modes)
    got = [{"ep2_sigmoid_groups/pynative": r["ep2_sigmoid_groups/jit"], **r} for r in results]
    _check(got, {"pynative": ref["jit"], "jit": ref["jit"]}, ["ep2_sigmoid_groups"])
    for r in results:      # jit_variable False: jit's padded exchange ran, the graph path recorded nothing
        assert r["ep2_sigmoid_groups/jit"]["counts"] == [{"eager": None, "graph": None, "sent_rows": 0,
                                                          "buffer_rows": 0}]
    plan = results[0]["ep2/pynative"]["plan"]
    assert "local kernel: expert_parallel" in plan
    assert "experts.w_gate: (ep, None, None) (declared), grad summed over nothing" in plan


def test_ep2_jit_expert_that_gets_no_rows():
    """jit's variable path with an expert no row is routed to (expert 3, rank 1's second local expert: it
    computes its zero sentinel row only) equals one process, forward and backward (every weight after 2 steps)."""
    results = EP2.results()
    ref = dead_expert_jit()
    got = [{"ep2_dead_expert/pynative": r["ep2_dead_expert/jit"], **r} for r in results]
    _check(got, {"pynative": ref["jit"], "jit": ref["jit"]}, ["ep2_dead_expert"])
    for r in results:
        (counts,) = r["ep2_dead_expert/jit"]["counts"]
        c = np.array(counts["graph"])
        assert c.shape == (2, 4) and (c[:, 3] == 0).all() and (c[:, :3] > 0).all(), c
        assert c.sum() == 2 * (BATCH_TOKENS // 2) * 2, c


def test_ep4_ep2xdp2_ep2xtp2(single_process):
    results = EP4.results()
    _check(results, single_process, ["ep4", "ep2_tp2"], {"ep2_tp2": ["pynative"]})
    _uneven_variable_path(results, "ep4", 4, 4)
    _uneven_variable_path(results, "ep2_tp2", 2, 2, ("pynative",))
    _uneven_variable_path(results, "ep2_dp2_global_aux", 2, 4, ("pynative",))
    _check(results, global_aux_pynative(), ["ep2_dp2_global_aux"],  # batch-wide loss
           {"ep2_dp2_global_aux": ["pynative"]})
    plan = results[0]["ep2_dp2_global_aux/pynative"]["plan"]
    assert "experts.w_gate: (ep, None, None) (declared), grad summed over ['edp']" in plan
    assert "router.weight: (None, None) (derived), grad summed over ['edp', 'ep']" in plan


@computed_ahead
def trainer_accumulate_one_process():
    """The one-process PyNative reference of the accumulating ep2 jit job: 8 rows per step."""
    from tests.bodies.moe_body import run_trainer
    from tests.test_trainer import build_assets
    return run_trainer(build_assets(ASSETS)["yaml"], tempfile.mkdtemp(prefix="mfc_moe_one_acc_"),
                       MOE_KEYS + ACCUMULATE + ["--runner_config.batch_size", 4], modes=(1,))[1]


@computed_ahead
def trainer_one_process():
    """(output folder, records per mode) of the one-process run the ep2 trainer job is compared with."""
    from tests.bodies.moe_body import run_trainer
    from tests.test_trainer import build_assets
    one = tempfile.mkdtemp(prefix="mfc_moe_one_")
    return one, run_trainer(build_assets(ASSETS)["yaml"], one, MOE_KEYS + ["--runner_config.batch_size", 4])


def test_trainer_ep2_jit_with_accumulation_matches_one_process():
    """run_mindformer.py, jit, ep2 (dp2) with 2 accumulation micro-steps = one process in PyNative with the same
    8 rows per step: losses, load-balancing loss and gradient norm of every step."""
    got = TRAINER_EP2_ACCUMULATE.results()[0][0]
    want = trainer_accumulate_one_process()
    assert len(got) == len(want) == 3
    for key in ("loss", "aux_loss", "grad_norm"):
        a, b = np.array([r[key] for r in got]), np.array([r[key] for r in want])
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (key, a, b)
    np.testing.assert_allclose([r["expert_load"] for r in got], [r["expert_load"] for r in want], atol=1e-3)


def test_trainer_ep2_matches_one_process():
    """run_mindformer.py: ep2 (dp2) on 2 workers = one process, PyNative and jit: losses, expert load and the
    load-balancing loss of every step (with the expert bias moved after every step from the global
    counts); the ep2 checkpoint resumes on one process with the same losses."""
    from tests.bodies.moe_body import run_trainer
    got = TRAINER_EP2.results()[0]
    yaml = TRAINER_EP2.used_kwargs["yaml"]
    one, want = trainer_one_process()
    for mode in (1, 0):
        g, w = got[mode], want[mode]
        assert len(g) == len(w) == 3
        for key in ("loss", "aux_loss", "grad_norm"):
            a, b = np.array([r[key] for r in g]), np.array([r[key] for r in w])
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (mode, key, a, b)
        assert min(r["grad_norm"] for r in w) > MAX_GRAD_NORM, "clipping not exercised"
        np.testing.assert_allclose([r["expert_load"] for r in g], [r["expert_load"] for r in w], atol=1e-3)
        assert w[-1]["loss"] < w[0]["loss"]
        assert sum(w[0]["expert_load"][0]) == 4 * 32 * 2     # every token's 2 choices, per micro-batch
    # the ep2 checkpoint of step 1 (experts split over 2 ranks) resumes on one process exactly as the one-process
    # checkpoint of step 1 does; both hold the expert bias moved after step 1
    RESUMED = []

    def resume(out):
        ckpt = os.path.join(out, "mode1", "checkpoint", "step_1")
        RESUMED.append(tempfile.mkdtemp(prefix="mfc_moe_resumed_"))
        return run_trainer(yaml, RESUMED[-1],
                           MOE_KEYS + ["--runner_config.batch_size", 4, "--load_checkpoint", ckpt, "--resume_training",
                                       "True"], modes=(1,))[1]
    from_ep2, from_one = resume(TRAINER_EP2.used_kwargs["out_root"]), resume(one)
    assert [r["step"] for r in from_ep2] == [r["step"] for r in from_one] == [2, 3]
    a, b = np.array([r["loss"] for r in from_ep2]), np.array([r["loss"] for r in from_one])
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (a, b)
    # the resumed run continues with the saved expert bias: steps 2 and 3 are those of the uninterrupted run,
    # exactly (with the bias restarted at zero the routing of step 2 differs: measured)
    for key in ("loss", "aux_loss", "expert_load"):
        assert [r[key] for r in from_one] == [r[key] for r in want[1][1:]], key
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    ends = []
    for root in (one, RESUMED[-1]):       # step 3's expert bias: uninterrupted vs resumed at step 1
        directory = os.path.join(root, "mode1", "checkpoint")
        specs = {k: v for k, v in checkpoint_specs(directory, 3).items() if k.endswith("router.expert_bias")}
        assert len(specs) == 1, sorted(checkpoint_specs(directory, 3))   # one MoE layer (the first is dense)
        ends.append(load_checkpoint(directory, specs, step=3, strict=False))
    assert ends[0].keys() == ends[1].keys()
    for k in ends[0]:
        np.testing.assert_array_equal(ends[0][k], ends[1][k])
        assert np.abs(ends[0][k]).max() > 0


def test_checkpoint_across_expert_parallel_sizes():
    """ep1 -> ep2 -> ep4 and ep2 -> ep1 through the checkpoint's resharding: every weight and expert bias merged
    from the loading ranks equals the saved one exactly, and each loaded model's loss on a batch equals the
    one-process loss of the saved weights."""
    import json
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    results = CHECKPOINT_EP.results()
    saved, want_loss = _CKPT["saved"], _CKPT["loss"]
    for name, experts_per_rank in (("ep2_from_ep1", 2), ("ep4_from_ep2", 1)):
        merged = _merge(results, name)
        assert sorted(merged) == sorted(saved)
        assert any(n.endswith("router.expert_bias") for n in merged)
        for pname, full in merged.items():
            np.testing.assert_array_equal(full, saved[pname], err_msg=f"{name}: {pname}")
        for rank, per_rank in enumerate(results):
            assert abs(per_rank[name]["loss"] - want_loss) <= 1e-5 * abs(want_loss), (name, rank)
            assert per_rank[name]["expert_shape"][0] == experts_per_rank
    # the ep2 checkpoint holds each rank's own experts (rank 1 = ep index 1: experts 2 and 3) ...
    ep2 = CHECKPOINT_EP.used_kwargs["ep2_dir"]
    with open(os.path.join(ep2, "step_1", "rank_1.json")) as f:
        entry = json.load(f)["tensors"]["decoder.layers.1.mlp.experts.w_gate"]
    assert entry["slice"][0] == [2, 4] and entry["written"]
    # ... and loads into one process (ep1)
    one = load_checkpoint(ep2, checkpoint_specs(ep2))
    assert sorted(one) == sorted(saved)
    for pname, value in one.items():
        np.testing.assert_array_equal(value, saved[pname], err_msg=f"ep1_from_ep2: {pname}")
