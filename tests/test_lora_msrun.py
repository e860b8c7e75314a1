"""LoRA under msrun = one process: tp2 in jit (adapters sharded like the linear they adapt: column A replicated /
B split, row A split / B replicated), pp2, dp2 with hsdp level2 (adapter gradients and AdamW state sharded over
dp; dp2 alone is this run without the sharding) on the Qwen3 fixture, and dp2 x ep2 on the Qwen3-MoE fixture
(LoRA on the attention linears, experts frozen), in PyNative: the losses of a 3-step fine-tune agree to a relative
1e-5 and the adapter weights of the last checkpoint to 1e-4 of their largest magnitude (measured <= 2.4e-5: AdamW
divides by the root of tiny second moments, which lifts rounding differences of near-zero gradients).

The jobs run in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the
one-process references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import job
from tests.test_lora import PET, RUN, argv, lora_yaml, losses
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
SAVE3 = ["--runner_config.max_steps", 3, "--callbacks",
         "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 3}]"]
PAR = ["--use_parallel", "True", "--runner_config.batch_size", 2]
HSDP = [*PAR, "--parallel_config.data_parallel", 2, "--parallel.enable_parallel_optimizer", True, "--hsdp.threshold", 0]
JOBS = {   # name -> (fixture, mode, parallel flags)
    "tp2_jit": ("qwen3", 0, [*PAR, "--parallel_config.model_parallel", 2, "--runner_config.batch_size", 4]),
    "pp2_pynative": ("qwen3", 1, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2,
                                  "--parallel_config.micro_batch_num", 2, "--runner_config.batch_size", 2]),
    # hsdp level2: the adapters' gradients and AdamW state sharded over dp (threshold 0: every adapter)
    "dp2_hsdp2_pynative": ("qwen3", 1, [*HSDP, "--hsdp.optimizer_level", "level2"]),
    "ep2_pynative": ("qwen3_moe", 1, [*PAR, "--parallel_config.data_parallel", 2,
                                      "--parallel_config.expert_parallel", 2]),
}
MOE_PET = dict(PET, target_modules=".*q_proj|.*o_proj")
FIXTURES = {"qwen3": PET, "qwen3_moe": MOE_PET}


def run_many(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn; the exit codes."""
    return [run_mindformer.main(a) for a in argvs]


@functools.lru_cache(maxsize=None)
def plan():
    """The YAMLs, output folders and the workers' argvs (made once per process)."""
    base = tempfile.mkdtemp(prefix="lora_msrun_")
    configs = {}
    for name, pet in FIXTURES.items():
        os.makedirs(os.path.join(base, name))
        configs[name] = lora_yaml(os.path.join(base, name), pet, folder=os.path.join(HF, name))
    work = [argv(configs[fx], os.path.join(base, name), "--mode", mode, *RUN, *SAVE3, *flags)
            for name, (fx, mode, flags) in JOBS.items()]
    return base, configs, work


TWO = job("lora_tp2_pp2_hsdp_ep2", 2, "tests.test_lora_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=900,
          group=__name__)


def adapters(out):
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    root = os.path.join(str(out), "checkpoint")
    return load_checkpoint(root, checkpoint_specs(root, 3), rank=0, step=3)


@pytest.fixture(scope="module")
def runs():
    from pathlib import Path
    base, configs, work = plan()
    base = Path(base)
    for fx, mode in sorted({(fx, mode) for fx, mode, _ in JOBS.values()}):
        assert run_mindformer.main(argv(configs[fx], base / f"p1_{fx}_{mode}", "--mode", mode, *RUN, *SAVE3)) == 0
    assert TWO.results() == [[0] * len(work)] * 2
    return base


@pytest.mark.parametrize("job", sorted(JOBS))
def test_lora_on_workers_equals_one_process(runs, job):
    fx, mode, _ = JOBS[job]
    one = runs / f"p1_{fx}_{mode}"
    got, want = losses(runs / job), losses(one)
    assert len(want) == 3 and all(np.isfinite(want))
    assert_close(got, want)
    a, b = adapters(runs / job), adapters(one)
    assert sorted(a) == sorted(b) and all(k.endswith((".lora_a.weight", ".lora_b.weight")) for k in a)
    for k in a:
        scale = np.abs(b[k]).max()
        assert np.abs(a[k] - b[k]).max() <= 1e-4 * scale, k     # measured <= 2.4e-5 (AdamW on near-zero grads)
