"""MindFormers' real Qwen3 fine-tuning YAML (``finetune_qwen3.yaml``: HFDataLoader, take, AlpacaInstructDataHandler,
PackingHandler pack, input_columns with loss_mask and position_ids, run_mode finetune) runs as it is on 2 workers,
with only paths and sizes given on the command line: the tiny transformers-made Qwen3 folder as
pretrained_model_dir and load_checkpoint, the 50-record Alpaca file as the data path, data_parallel 2 (no tp/pp),
float32 compute (CPU kernels have no bfloat16 matmul), seq_length 256, 20 steps; and a learning rate of 1e-2 (the
file's 1e-6 moves a loss by nothing in 20 steps).

Proofs: the loss goes down over the 20 steps; each step's loss equals a one-process run with the same global batch
(batch_size 2), which is the mean over the unmasked tokens of the whole global batch (the dp split does not change
it).

The 2-worker run is a job of the suite's batched 2-worker launch (tests/msrun_batch.py); the one-process
reference runs here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import computed_ahead, job
from tests.test_trainer import records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
HERE = os.path.dirname(os.path.abspath(__file__))
YAML = os.path.join(HERE, "data", "mindformers_configs", "finetune_qwen3.yaml")
FOLDER = os.path.join(HERE, "data", "hf", "qwen3")
ALPACA = os.path.join(HERE, "data", "sft", "alpaca_arith.json")
STEPS = 20
SHORT = ["--runner_config.max_steps", 2, "--callbacks", "[{type: MFLossMonitor}]"]    # after argv's: they win


def argv(out, *extra):
    return ["--config", YAML, "--pretrained_model_dir", FOLDER, "--load_checkpoint", FOLDER,
            "--train_dataset.data_loader.path", ALPACA, "--output_dir", str(out),
            "--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
            "--model.model_config.compute_dtype", "float32", "--model.model_config.seq_length", "256",
            "--runner_config.epochs", "2", "--runner_config.max_steps", str(STEPS),
            "--lr_schedule.learning_rate", "1e-2", *map(str, extra)]


def run_one(argvs):
    """msrun body: ``run_mindformer.main`` for each argv; the exit codes."""
    return [run_mindformer.main(a) for a in argvs]


@functools.lru_cache(maxsize=None)
def plan():
    """The output folders and the workers' argv (made once per process)."""
    base = tempfile.mkdtemp(prefix="sft_msrun_")
    out = {k: os.path.join(base, k) for k in ("dp2", "one", "dp2_accumulate", "one_accumulate", "pp2")}
    dp2 = [argv(out["dp2"], "--use_parallel", "True", "--parallel_config.data_parallel", 2),
           argv(out["dp2_accumulate"], "--use_parallel", "True", "--parallel_config.data_parallel", 2,
                "--runner_config.gradient_accumulation_steps", 2, *SHORT),
           argv(out["pp2"], "--use_parallel", "True", "--parallel_config.pipeline_stage", 2,
                "--parallel_config.micro_batch_num", 2, "--runner_config.batch_size", 2, *SHORT)]
    return out, dp2


DP2 = job("sft_finetune_qwen3_dp2", 2, "tests.test_sft_msrun:run_one", lambda: {"argvs": plan()[1]}, timeout=600,
          group=__name__)


@computed_ahead
def one_process():
    """The one-process runs into plan()'s "one" and "one_accumulate" folders."""
    out, _ = plan()
    assert run_mindformer.main(argv(out["one"], "--use_parallel", "False", "--parallel_config.data_parallel", 1,
                                    "--runner_config.batch_size", 2)) == 0
    assert run_mindformer.main(argv(out["one_accumulate"], "--use_parallel", "False", "--parallel_config.data_parallel",
                                    1, "--runner_config.batch_size", 4, *SHORT)) == 0


@pytest.fixture(scope="module")
def runs():
    out, _ = plan()
    one_process()
    assert DP2.results() == [[0, 0, 0], [0, 0, 0]]
    return out


def losses(out):
    return [r["loss"] for r in records(out)]


@pytest.fixture(scope="module")
def per_epoch(tmp_path_factory):
    """Steps of one epoch on each of the 2 data-parallel ranks: the YAML's chain makes the rows (rows of
    seq_length 256, documents packed two to a row where they fit), each rank takes half of them."""
    import yaml
    from mindformers_core.data import HFTokenizer, build_sft_rows, load_hf_dataset
    with open(YAML) as f:
        chain = yaml.safe_load(f)["train_dataset"]["data_loader"]["handler"]
    rows = build_sft_rows(load_hf_dataset(ALPACA, cache_dir=str(tmp_path_factory.mktemp("rows"))), chain,
                          HFTokenizer(FOLDER), 256)
    assert 25 <= len(rows) < 50 and any(r["segment_ids"].max() > 0 for r in rows)       # packed
    return len(rows) // 2


def test_the_real_yaml_fine_tunes_on_two_workers_and_the_loss_goes_down(runs, per_epoch):
    """Steps of the second epoch see the rows of the first epoch's first steps again (shuffle: False), at a
    far lower loss; the second epoch's first step is below every step of the first epoch."""
    dp2 = losses(runs["dp2"])
    assert len(dp2) == STEPS and all(np.isfinite(dp2))
    again = list(range(per_epoch, STEPS))
    assert len(again) >= 3
    for step in again:
        assert dp2[step] < 0.75 * dp2[step - per_epoch], dp2
    assert dp2[per_epoch] < min(dp2[:per_epoch]), dp2


def test_two_workers_equal_one_process_with_the_same_global_batch(runs, per_epoch):
    """Over the first epoch (in the second, one process reads the row a rank drops: the row count is odd)."""
    assert_close(losses(runs["dp2"])[:per_epoch], losses(runs["one"])[:per_epoch])


def test_accumulation_on_two_workers_equals_one_process_with_the_global_batch(runs):
    """dp2 x gradient_accumulation_steps 2 (one row per micro-step and rank) = one process with the 4 rows at
    once: the micro-steps are weighted by their unmasked tokens counted over both ranks (TokenWeights)."""
    got, want = losses(runs["dp2_accumulate"]), losses(runs["one_accumulate"])
    assert len(want) == 2 and all(np.isfinite(want))
    assert_close(got, want)


# (the YAML's packed rows at context_parallel 2: the feature grid's cells full-qwen3-packed-cp2_ring-jit and
# lora-qwen3-packed-cp2_ring-pynative, tests/test_grid_msrun.py; tests/test_packing_msrun.py: a boundary inside a
# chunk)


def test_packed_rows_through_pipeline_microbatches_equal_one_process(runs):
    """pipeline_stage 2 with 2 microbatches of 2 packed rows (the YAML's jit): loss_mask, position_ids and
    segment_ids go through the microbatches with the ids and labels (every stage takes the positions and
    documents, the last the loss mask) and the microbatches are weighted by their unmasked tokens: each step's
    loss is the one process's with the 4 rows at once."""
    got, want = losses(runs["pp2"]), losses(runs["one_accumulate"])
    assert len(want) == 2
    assert_close(got, want)
