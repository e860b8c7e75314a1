"""MindFormers' PyNative TrainConfig DeepSeek-V3 file (tests/data/mindformers_configs/pynative_ds3.yaml, as it is)
on 4 workers equals one process. The file is shrunk on the command line in its own dialect (sizes, float32,
data, 2 steps at lr 1e-3); everything else is the file's: multi-latent attention with YaRN (factor 40),
one MTP depth (factor 0.3), sigmoid group-limited routing with the expert bias and the sequence-wise aux loss,
full recompute of layers 0-3 (all 3 of the shrunk model), gradient clipping at 1.0, sequence parallelism, and its
fully sharded data parallelism
(``data_parallel_shard_strategy: optim_grads_params``: hsdp level3). Its parallel sizes (all 1, data parallel
= every worker) are shrunk to 4 workers as data parallel 2 x tensor parallel 2 (sequence parallel on) with
the experts over ep 2. A second run of the same file covers Ulysses context parallelism with hsdp: dp2 x cp2
(``context_parallel_method: ulysses``). Losses, MTP losses and aux losses per step = one process, relative 1e-5.

Both runs are one job (``run_recording_hsdp``) of the suite's batched 4-worker launch (tests/msrun_batch.py), in
PyNative (the file's own mode); the one-process reference runs here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import job
from tests.test_mindformers_configs import real
from tests.test_trainer import mindrecord_corpus, records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
FILE = real("pynative_ds3.yaml")
SHRINK = ["--model.compute_dtype", "float32", "--model.num_hidden_layers", 3, "--model.hidden_size", 32,
          "--model.num_attention_heads", 4, "--model.intermediate_size", 64, "--model.kv_lora_rank", 16,
          "--model.q_lora_rank", 24, "--model.qk_rope_head_dim", 8, "--model.qk_nope_head_dim", 8,
          "--model.v_head_dim", 12, "--model.vocab_size", 384, "--model.seq_length", 32,
          "--model.max_position_embeddings", 64, "--model.moe_intermediate_size", 16,
          "--model.moe_shared_expert_intermediate_size", 16,
          "--training.steps", 2, "--lr_scheduler.learning_rate", 1e-3, "--callbacks", "[{type: MFLossMonitor}]"]
ONE = ["--training.local_batch_size", 4, "--training.global_batch_size", 4]
FOUR = ["--use_parallel", True, "--training.local_batch_size", 2, "--training.global_batch_size", 4]
DP2_TP2_EP2 = [*FOUR, "--parallelism.tensor_parallel", 2, "--parallelism.expert_parallel", 2]
NO_MTP = ["--model.num_nextn_predict_layers", 0]      # MTP with context parallelism is refused (docs/deepseek_v3.md)
DP2_CP2_ULYSSES = [*FOUR, *NO_MTP, "--parallelism.context_parallel", 2, "--parallelism.context_parallel_method",
                   "ulysses"]


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders and argvs (made once per process, when a launch or a test first asks)."""
    base = tempfile.mkdtemp(prefix="ds3_pynative_")
    data = mindrecord_corpus(base, 32)   # MindDataset, the file's loader
    common = ["--config", FILE, *SHRINK, "--train_dataset_dir", data["dir"],
              "--train_dataset.tokenizer_file", data["tokenizer"]]
    runs = {"one": ONE, "one_no_mtp": [*ONE, *NO_MTP], "dp2_tp2_ep2": DP2_TP2_EP2, "dp2_cp2_ulysses": DP2_CP2_ULYSSES}
    out = {k: os.path.join(base, k) for k in runs}
    argvs = {k: [*map(str, common), "--output_dir", out[k], *map(str, extra)] for k, extra in runs.items()}
    return out, argvs


def run_recording_hsdp(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn; per run its exit code and how many of this
    rank's parameters hsdp shards (the trainer's ``_hsdp`` watched), so that the test sees the file's FSDP
    strategy at work, not only read."""
    from mindformers_core.training import steps
    build, seen = steps._hsdp, []

    def watched(*args, **kwargs):
        wrapped = build(*args, **kwargs)
        seen.append(len(list(wrapped.sharded_params())))
        return wrapped

    steps._hsdp = watched
    try:
        out = []
        for a in argvs:
            del seen[:]
            out.append((run_mindformer.main(a), sum(seen)))
        return out
    finally:
        steps._hsdp = build


FOUR_JOB = job("deepseek_v3_pynative_file", 4, "tests.test_deepseek_pynative_msrun:run_recording_hsdp",
               lambda: {"argvs": [plan()[1]["dp2_tp2_ep2"], plan()[1]["dp2_cp2_ulysses"]]}, timeout=900,
               group=__name__)


@pytest.fixture(scope="module")
def runs():
    out, argvs = plan()
    assert run_mindformer.main(argvs["one"]) == 0 and run_mindformer.main(argvs["one_no_mtp"]) == 0
    results = FOUR_JOB.results()
    assert [[code for code, _ in rank] for rank in results] == [[0, 0]] * 4
    sharded = {run: [rank[i][1] for rank in results] for i, run in enumerate(("dp2_tp2_ep2", "dp2_cp2_ulysses"))}
    return out, sharded


@pytest.mark.parametrize("run, reference, keys", [("dp2_tp2_ep2", "one", ("loss", "mtp_loss", "aux_loss")),
                                                   ("dp2_cp2_ulysses", "one_no_mtp", ("loss", "aux_loss"))])
def test_the_file_on_4_workers_equals_one_process(runs, run, reference, keys):
    out, sharded = runs
    one, four = records(out[reference]), records(out[run])
    assert min(sharded[run]) >= 10, sharded        # hsdp level3 (data_parallel_shard_strategy) shards the weights
    assert len(one) == 2 and all(np.isfinite(r["loss"]) for r in one) and abs(one[1]["loss"] - one[0]["loss"]) > 1e-4
    assert all(r[k] > 0 for r in one for k in keys)
    for key in keys:
        assert_close([r[key] for r in four], [r[key] for r in one])
    assert ("mtp_loss" in four[0]) == ("mtp_loss" in keys)
