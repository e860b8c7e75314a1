"""A global batch without a target token at data parallel 2 (issue 42 item 1): MindFormers' finetune_qwen3.yaml on
2 workers (PyNative, batch 2 per rank) with step 2's four rows holding no target token. Both ranks count the
global batch from the data alike (no communication), so neither runs step 2: loss 0 and ``no_target`` logged,
weights and AdamW moments after step 2 those after step 1 on each rank, not counted by the guard; steps 1 and 3
equal one process with the same 4-row global batches (relative 1e-5).

The 2-worker run is a job of the suite's batched 2-worker launch (tests/msrun_batch.py); the one-process
reference runs here."""
import functools
import os
import tempfile

import numpy as np
import pytest

from tests.msrun_batch import computed_ahead, job

pytestmark = pytest.mark.msrun


@functools.lru_cache(maxsize=None)
def plan():
    base = tempfile.mkdtemp(prefix="sft_accounting_msrun_")
    from tests.test_sft_accounting import long_records
    import json
    data = os.path.join(base, "long.json")
    with open(data, "w") as f:
        json.dump(long_records(24), f)
    return base, data


def empty_step_run(out, data, dp):
    """Train 3 steps with the rows of step 2's global batch emptied; (records, state after step 1 == state
    before step 3) of this rank."""
    from tests.test_sft_accounting import _config, _state
    from mindformers_core.training.trainer import Trainer
    import pathlib
    cfg = _config(pathlib.Path(out), data, "context.mode=1", "runner_config.max_steps=3",
                  "runner_config.max_consecutive_skipped_steps=1", "lr_schedule.learning_rate=1e-2",
                  f"use_parallel={dp > 1}", f"parallel_config.data_parallel={dp}", f"runner_config.batch_size={4 // dp}",
                  "train_dataset.data_loader.handler=[{type: AlpacaInstructDataHandler}]", worker_num=dp)
    t = Trainer(cfg, worker_num=dp)
    t.setup()
    d = t.inputs.data
    n, per = d.num_samples, d.num_samples // d.dp_size
    order = np.random.default_rng([d.seed, 0]).permutation(n) if d.shuffle else np.arange(n)
    local = 4 // dp
    for rank in range(dp):                       # every rank's share of step 2's global batch
        for pos in range(local, 2 * local):
            assert pos < per
            d.rows[int(order[rank::dp][pos])]["loss_mask"][:] = 0
    states, step_fn = [], t.step_fn

    def recorded(*batch):
        states.append(_state(t))
        out = step_fn(*batch)
        states.append(_state(t))
        return out
    t.step_fn = recorded
    history = t.train()
    same = len(states) == 4 and all(np.array_equal(a, b) for a, b in zip(states[1], states[2]))
    return [[r["loss"], bool(r.get("no_target", False)), bool(r.get("skipped", False))] for r in history], same


def run_dp2(out, data):
    """msrun body."""
    return empty_step_run(out, data, 2)


DP2 = job("sft_empty_step_dp2", 2, "tests.test_sft_accounting_msrun:run_dp2",
          lambda: {"out": os.path.join(plan()[0], "dp2"), "data": plan()[1]}, timeout=600, group=__name__)


@computed_ahead
def one_process():
    base, data = plan()
    return empty_step_run(os.path.join(base, "one"), data, 1)


def test_an_empty_global_batch_at_dp2_is_logged_on_every_rank_and_equals_one_process():
    one, one_same = one_process()
    ranks = DP2.results()
    assert one_same and [r[1:] for r in one] == [[False, False], [True, False], [False, False]]
    assert one[1][0] == 0.0 and all(np.isfinite(r[0]) and r[0] > 0 for r in (one[0], one[2]))
    for history, same in ranks:
        assert same                                               # weights and moments untouched by step 2
        assert [r[1:] for r in history] == [r[1:] for r in one]
        assert history[1][0] == 0.0
        for (got, _, _), (want, _, _) in zip(history, one):
            assert got == pytest.approx(want, rel=1e-5, abs=0.0)
