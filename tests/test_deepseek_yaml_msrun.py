"""MindFormers' research DeepSeek-V3 file (tests/data/mindformers_configs/research_pretrain_deepseek3_671b.yaml, the
graph-mode dialect: MLA, sigmoid routing with the expert bias, mtp_depth 1) shrunk on the command line and run on
8 workers as data parallel 2 x tensor parallel 2 x pipeline 2 with expert parallel 2 (carved out of dp), the
pipeline DualPipeV (4 stages in a V), multi-token prediction on, equals one process: the loss and mtp_loss of 2
steps (and the global gradient norm) to a relative 1e-5. The first and the last stage sit on pipeline rank 0, where the MTP depth's embedding is
the first stage's Parameter itself (model_builder._share_embedding; the runtime sums the two stages' gradients).

Shrunk as tests/test_deepseek_yaml.py shrinks it (sizes, Megatron data, its research auto_register lines dropped;
2 layers, the first dense), the layers split [0, 1, 0, 1] over the
DualPipeV stages (the last stage keeps a layer: see the MTP split rule in docs/deepseek_v3.md). Three settings of
the file are changed for the run and named here: ``parallel.enable_parallel_optimizer`` off (hsdp with multi-token
prediction under a pipeline is refused: not built), PyNative (``--mode 1``) and ``context.device_target CPU`` (eager
ops run synchronously, not through the dispatch thread meant for Ascend). Under jit, 8 workers compiling their stages
on the machine's 2 cores left the other pipeline rank's eager all-reduce to time out (measured once, load 12-15);
the pipeline's jit path is proven on 2 workers (tests/test_deepseek_pp_msrun.py). The research file's aux loss
(aux_loss_factors [0.0001]) is in the loss; the logged aux_loss agreed with one process to 7.3e-8 (measured: loss
5.6e-7, mtp_loss 6.7e-8, grad norm 8.0e-8 relative at most). The batched job took 10-16 s on rank 0; with
the file's own ``device_target: Ascend`` eager ops go through the dispatch thread and it took 170 s. The one process runs the same file with
the parallel sizes at 1 and the 8 rows as one batch.

One job of the suite's batched 8-worker launch (tests/msrun_batch.py); the one-process reference runs here."""
import functools
import os
import tempfile

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.training import read_yaml
from tests.msrun_batch import job
from tests.test_deepseek_yaml import SHRUNK
from tests.test_hf_msrun import argv
from tests.test_mindformers_configs import real
from tests.test_trainer import megatron_corpus, records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
# the shrunk sizes of tests/test_deepseek_yaml.py (2 layers, the first dense), 2 steps, the loss log only
SIZES = [*SHRUNK, "--callbacks", "[{type: MFLossMonitor}]",
         "--parallel.enable_parallel_optimizer", False, "--mode", 1,
         "--context.device_target", "CPU"]
ONE = ["--runner_config.batch_size", 8]
EIGHT = ["--use_parallel", True, "--parallel_config.data_parallel", 2, "--parallel_config.model_parallel", 2,
         "--parallel_config.pipeline_stage", 2, "--parallel_config.expert_parallel", 2,
         "--parallel_config.micro_batch_num", 4, "--runner_config.batch_size", 1,
         "--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
         "--parallel.pipeline_config.pipeline_interleave", 2,
         "--parallel.pipeline_config.layers_per_stage", "[0, 1, 0, 1]"]


@functools.lru_cache(maxsize=None)
def plan():
    """The shrunk file, the runs' output folders and argvs (made once per process)."""
    base = tempfile.mkdtemp(prefix="ds3_yaml_msrun_")
    raw = read_yaml(real("research_pretrain_deepseek3_671b.yaml"))
    del raw["model"]["model_config"]["auto_register"], raw["model"]["arch"]["auto_register"]
    path = os.path.join(base, "deepseek3.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    data = megatron_corpus(base)
    common = [*SIZES, "--train_dataset.data_loader.config.data_path", f"['1', '{data['prefix']}']",
              "--train_dataset.tokenizer_file", data["tokenizer"]]
    out = {k: os.path.join(base, k) for k in ("p1", "dp2_tp2_ep2_pp2_dualpipev")}
    return path, common, out, [argv(path, out["dp2_tp2_ep2_pp2_dualpipev"], *common, *EIGHT)]


EIGHT_WORKERS = job("deepseek_v3_yaml_8_workers", 8, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[3]},
                    timeout=900, group=__name__)


@pytest.fixture(scope="module")
def runs():
    path, common, out, eight = plan()
    assert run_mindformer.main(argv(path, out["p1"], *common, *ONE)) == 0
    assert EIGHT_WORKERS.results() == [[0]] * 8
    return out


def test_shrunk_research_file_on_8_workers_equals_one_process(runs):
    one, eight = records(runs["p1"]), records(runs["dp2_tp2_ep2_pp2_dualpipev"])
    assert len(one) == 2 and all(np.isfinite(r["loss"]) and 1.2 < r["mtp_loss"] < 2.4 for r in one)
    assert all("expert_load" in r for r in one) and abs(one[1]["loss"] - one[0]["loss"]) > 1e-4
    for key in ("loss", "mtp_loss", "grad_norm"):
        assert_close([r[key] for r in eight], [r[key] for r in one])
