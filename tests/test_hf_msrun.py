"""A Hugging Face folder (the Qwen3-MoE fixture saved by transformers) loaded straight onto parallel layouts
and fine-tuned under msrun equals one process: each rank reads only its slices (tp: column/row halves, ep: its
experts, pp: its stage's layers), and the losses of a 2-step fine-tune (the first is the loaded model's own)
agree with one process to a relative 1e-5. The live export at the end of a tp2 and an ep2 run that did not
change the weights (learning rate 0) gives back the folder's tensors bitwise.

The tp2 / ep2 / pp2 jobs run in turn (``run_many``) in the suite's batched 2-worker launch, dp2 x tp2 x ep2 in the
4-worker one (tests/msrun_batch.py); the one-process references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.models.hf.folder import open_folder
from tests.msrun_batch import computed_ahead, job
from tests.test_trainer import build_assets, records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "qwen3_moe")
STEPS = ["--runner_config.max_steps", 2, "--lr_schedule.warmup_steps", 0]
QUIET = ["--callbacks", "[{type: MFLossMonitor}]"]
PARALLEL = ["--use_parallel", "True", "--runner_config.batch_size", 2]
TP2 = [*PARALLEL, "--parallel_config.model_parallel", 2, "--runner_config.batch_size", 4]
EP2 = [*PARALLEL, "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2]
PP2 = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2,
       "--runner_config.batch_size", 2,
       "--model.model_config.offset", "[1, 0]"]      # 3 layers: 2 on the first stage, 1 on the second
FROZEN = ["--runner_config.max_steps", 1, "--optimizer.learning_rate", 0.0, "--lr_schedule.learning_rate", 0.0]


def hf_yaml(root: str, folder: str = FOLDER) -> str:
    """The trainer test's YAML with the model taken from ``folder``: no model sizes of its own, the folder as
    pretrained_model_dir and load_checkpoint, the folder's tokenizer (tokenizer kind hf)."""
    assets = build_assets(os.path.join(root, "assets"))
    with open(assets["yaml"]) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": 32}}
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = folder
    raw["train_dataset"].pop("tokenizer_file", None)
    path = os.path.join(root, "hf.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def argv(config, out, *extra):
    return ["--config", config, "--output_dir", str(out), *map(str, extra)]


def run_many(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn; the exit codes."""
    return [run_mindformer.main(a) for a in argvs]


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders and argvs (made once per process, when a launch or a test first asks)."""
    base = tempfile.mkdtemp(prefix="hf_msrun_")
    config = hf_yaml(base)
    out = {k: os.path.join(base, k) for k in ("p1_pynative", "pp2_pynative",
                                              "dp2_tp2_ep2_pynative", "tp2_frozen", "ep2_frozen", "tp2_export",
                                              "ep2_export")}
    # (tp2 PyNative and ep2 jit fine-tuning from the folder: the feature grid's cells
    # full-qwen3_moe-packed-tp2_sp-pynative and full-qwen3_moe-packed-ep2-jit, tests/test_grid_msrun.py)
    two = [argv(config, out["pp2_pynative"], "--mode", 1, *STEPS, *QUIET, *PP2),
           argv(config, out["tp2_frozen"], "--mode", 1, *FROZEN, *QUIET, *TP2, "--export_hf_dir", out["tp2_export"]),
           argv(config, out["ep2_frozen"], "--mode", 1, *FROZEN, *QUIET, *EP2, "--export_hf_dir", out["ep2_export"])]
    # PyNative: ep under jit is proven at 2 workers above, and a 4-worker jit compile costs ~20 s of the suite
    four = [argv(config, out["dp2_tp2_ep2_pynative"], "--mode", 1, *STEPS, *QUIET, *EP2,
                 "--parallel_config.model_parallel", 2)]
    return config, out, two, four


TWO = job("hf_tp2_ep2_pp2", 2, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=600,
          group=__name__)
FOUR = job("hf_dp2_tp2_ep2", 4, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[3]}, timeout=600,
           group=__name__)


@computed_ahead
def one_process():
    """The one-process PyNative run into plan()'s p1_pynative folder."""
    config, out, _, _ = plan()
    assert run_mindformer.main(argv(config, out["p1_pynative"], "--mode", 1, *STEPS, *QUIET)) == 0


@pytest.fixture(scope="module")
def runs():
    config, out, two, four = plan()
    one_process()
    assert TWO.results() == [[0] * len(two)] * 2 and FOUR.results() == [[0]] * 4
    return {k: v for k, v in out.items()}


def losses(out):
    return [r["loss"] for r in records(out)]


@pytest.mark.parametrize("job, mode", [("dp2_tp2_ep2", "pynative")])
def test_loaded_and_fine_tuned_on_workers_equals_one_process(runs, job, mode):
    one = losses(runs[f"p1_{mode}"])
    assert len(one) == 2 and all(np.isfinite(one))
    assert_close(losses(runs[f"{job}_{mode}"]), one)
    assert_close([r["aux_loss"] for r in records(runs[f"{job}_{mode}"])],
                 [r["aux_loss"] for r in records(runs[f"p1_{mode}"])])


def test_pp2_equals_one_process_in_the_language_loss(runs):
    """Qwen3-MoE's load-balancing loss is global over a batch's tokens (router_aux_loss_coef: aux_loss); a
    pipeline computes it per microbatch, which is another number (f and P are averaged before their product).
    The loaded model's language-model loss (loss - aux_loss of step 1) and the routing (each expert's load) are
    the one process's; step 2 follows an update whose aux-loss gradient differed (measured 1.3e-5 relative)."""
    one, pp = records(runs["p1_pynative"]), records(runs["pp2_pynative"])
    lm = [[r["loss"] - r["aux_loss"] for r in rs] for rs in (pp, one)]
    assert_close(lm[0][:1], lm[1][:1])
    assert_close(lm[0][1:], lm[1][1:], rel=1e-4)
    for a, b in zip(pp, one):       # per microbatch: half the tokens of the step, each microbatch
        np.testing.assert_allclose(np.array(a["expert_load"]) * 2, b["expert_load"], rtol=1e-6)
    assert abs(pp[0]["aux_loss"] - one[0]["aux_loss"]) > 1e-6


def test_one_process_starts_from_the_folder_not_from_random_weights(runs, tmp_path):
    """The first loss is the folder's model on the first batch: a run without load_checkpoint differs."""
    config = hf_yaml(str(tmp_path))
    assert run_mindformer.main(argv(config, tmp_path / "random", "--load_checkpoint", "''", "--runner_config.max_steps",
                                    1, *QUIET)) == 0
    assert abs(losses(tmp_path / "random")[0] - losses(runs["p1_pynative"])[0]) > 1e-3


@pytest.mark.parametrize("job", ["tp2", "ep2"])
def test_export_after_a_frozen_run_gives_the_folder_back_bitwise(runs, job):
    source, exported = open_folder(FOLDER), open_folder(str(runs[f"{job}_export"]))
    assert sorted(exported.tensors) == sorted(source.tensors)
    with source.reader() as a, exported.reader() as b:
        for name in source.tensors:
            assert np.array_equal(a(name), b(name)), name
    assert exported.config == source.config
    assert sorted(exported.tokenizer_files) == sorted(source.tokenizer_files)
