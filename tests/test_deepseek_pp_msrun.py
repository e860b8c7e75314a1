"""DeepSeek-V3 from its fixture folder (saved by transformers) under pipeline parallelism equals one process:
2-step fine-tunes through ``run_mindformer.main`` at pipeline_stage 2, the losses and global gradient norms of
every step to a relative 1e-5 and the merged weights after step 2 (AdamW moments' effect and the expert bias
included) to 1e-5 of the largest weight:

* 1F1B in PyNative (3 layers: 2 on the first stage, 1 on the second) and DualPipeV under jit (4 stages in a V,
  layers [1, 1, 1, 0]), multi-token prediction off. The one-process reference runs in PyNative (its jit run gives
  the same losses to 8e-8, tests/test_deepseek_v3_msrun.py). DeepSeek-V3 balances its experts with the expert
  bias (``noaux_tc``) and the fixture has no auxiliary loss, so unlike Qwen3-MoE (tests/test_hf_msrun.py, whose
  global aux loss is per microbatch under a pipeline) the loss is exactly comparable; the expert loads a
  pipeline logs are the mean over its microbatches (x micro_batch_num = the step's), and the bias update from the
  step's summed loads shows in step 2's loss and in the saved bias.
* Multi-token prediction (depth 1, factor 0.3) at 1F1B in PyNative: the last stage holds a copy of the
  embedding and takes each microbatch's ids, the two copies' gradients are summed between the two pipeline ranks
  (``pipeline/runtime.py`` ``_sum_tied``); loss and ``mtp_loss`` per step = one process, the checkpoint holds
  the embedding once with the one process's values, and so does the Hugging Face export at the end of the run. (DualPipeV with MTP, where both ends share rank 0's
  Parameter, runs in the 8-worker job of tests/test_deepseek_yaml_msrun.py.)

The three runs go in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the
one-process references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from mindformers_core.models.hf.folder import open_folder
from tests.msrun_batch import computed_ahead, job
from tests.test_deepseek_v3_msrun import FOLDER
from tests.test_hf_msrun import argv, hf_yaml
from tests.test_trainer import records, saved
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
STEPS = ["--runner_config.max_steps", 2, "--lr_schedule.warmup_steps", 0,
         "--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 2}]"]
MTP = ["--model.model_config.mtp_depth", 1, "--model.model_config.mtp_loss_factor", 0.3]
ONE = ["--runner_config.batch_size", 4]
PP2 = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2]
ONE_F_ONE_B = [*PP2, "--runner_config.batch_size", 2, "--parallel_config.micro_batch_num", 2,
               "--model.model_config.offset", "[1, 0]"]      # 3 layers: 2 on the first stage, 1 on the second
DUALPIPEV = [*PP2, "--runner_config.batch_size", 1, "--parallel_config.micro_batch_num", 4,
             "--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
             "--parallel.pipeline_config.pipeline_interleave", 2,
             "--parallel.pipeline_config.layers_per_stage", "[1, 1, 1, 0]"]
MICRO = {"pp2_1f1b_pynative": 2, "pp2_dualpipev_jit": 4, "pp2_mtp_1f1b_pynative": 2}


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders and argvs (made once per process, when a launch or a test first asks)."""
    base = tempfile.mkdtemp(prefix="ds3_pp_msrun_")
    config = hf_yaml(base, FOLDER)
    out = {k: os.path.join(base, k) for k in ("p1_pynative", "p1_mtp_pynative", *MICRO, "p1_mtp_export",
                                              "pp2_mtp_export")}
    two = [argv(config, out["pp2_1f1b_pynative"], "--mode", 1, *STEPS, *ONE_F_ONE_B),
           argv(config, out["pp2_dualpipev_jit"], "--mode", 0, *STEPS, *DUALPIPEV),
           argv(config, out["pp2_mtp_1f1b_pynative"], "--mode", 1, *STEPS, *MTP, *ONE_F_ONE_B,
                "--export_hf_dir", out["pp2_mtp_export"])]
    return config, out, two


TWO = job("deepseek_v3_pp2", 2, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=600,
          group=__name__)


@computed_ahead
def one_process():
    """The one-process runs into plan()'s p1_* folders."""
    config, out, _ = plan()
    assert run_mindformer.main(argv(config, out["p1_pynative"], "--mode", 1, *STEPS, *ONE)) == 0
    assert run_mindformer.main(argv(config, out["p1_mtp_pynative"], "--mode", 1, *STEPS, *MTP, *ONE,
                                    "--export_hf_dir", out["p1_mtp_export"])) == 0


@pytest.fixture(scope="module")
def runs():
    config, out, two = plan()
    one_process()
    assert TWO.results() == [[0] * len(two)] * 2
    return dict(out)


def assert_same_weights(got, want, rel=1e-5):
    """The same parameter names (each saved once) and every tensor within ``rel`` of its largest value."""
    assert sorted(got) == sorted(want)
    for name in want:
        scale = max(float(np.abs(want[name]).max()), 1e-12)
        diff = float(np.abs(np.asarray(got[name], np.float64) - want[name]).max())
        assert diff <= rel * scale, (name, diff, scale)


@pytest.mark.parametrize("name", ["pp2_1f1b_pynative", "pp2_dualpipev_jit"])
def test_pp2_equals_one_process(runs, name):
    one, pp = records(runs["p1_pynative"]), records(runs[name])
    assert len(one) == 2 and abs(one[1]["loss"] - one[0]["loss"]) > 1e-4 and "aux_loss" not in one[0]
    for key in ("loss", "grad_norm"):
        assert_close([r[key] for r in pp], [r[key] for r in one])
    for a, b in zip(pp, one):        # the mean over the microbatches: x micro_batch_num = the step's loads
        np.testing.assert_allclose(np.array(a["expert_load"]) * MICRO[name], b["expert_load"], rtol=1e-6)
    weights = saved(runs[name], 2)[0]
    assert_same_weights(weights, saved(runs["p1_pynative"], 2)[0])
    assert sorted(n for n in weights if n.endswith("router.expert_bias")) == ["decoder.layers.1.mlp.router.expert_bias",
                                                                         "decoder.layers.2.mlp.router.expert_bias"]


def test_pp2_with_multi_token_prediction_equals_one_process(runs):
    one, pp = records(runs["p1_mtp_pynative"]), records(runs["pp2_mtp_1f1b_pynative"])
    assert len(one) == 2 and all(1.2 < r["mtp_loss"] < 2.4 for r in one)
    for key in ("loss", "mtp_loss", "grad_norm"):
        assert_close([r[key] for r in pp], [r[key] for r in one])
    weights, want = saved(runs["pp2_mtp_1f1b_pynative"], 2)[0], saved(runs["p1_mtp_pynative"], 2)[0]
    assert "embedding.word_embeddings.weight" in weights and "mtp.layers.3.transformer_layer.mlp.router.expert_bias" in weights
    assert_same_weights(weights, want)


def test_export_after_pp2_with_multi_token_prediction_equals_one_process_export(runs):
    """The live export at the end of the pp2 MTP run (from the checkpoint that saved the embedding once) holds the
    folder's tensors and the MTP layer under DeepSeek's model.layers.3.* names (the fixture, saved by transformers,
    has none: the depth starts from its initial values), with the one process's values."""
    pp, one = open_folder(str(runs["pp2_mtp_export"])), open_folder(str(runs["p1_mtp_export"]))
    assert sorted(pp.tensors) == sorted(one.tensors)
    assert set(open_folder(FOLDER).tensors) < set(pp.tensors)
    assert "model.embed_tokens.weight" in pp.tensors and "model.layers.3.eh_proj.weight" in pp.tensors
    with pp.reader() as a, one.reader() as b:
        assert_same_weights({n: a(n) for n in pp.tensors}, {n: b(n) for n in one.tensors})
