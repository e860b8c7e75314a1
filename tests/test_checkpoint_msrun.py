"""4 real msrun ranks save dp2 x tp2 shards with the comm barrier; this (single) process loads
them resharded into tp4 and into full tensors."""
import os
import tempfile

import numpy as np
import pytest

from mindformers_core.checkpoint import (checkpoint_specs, list_steps, load_checkpoint, load_optimizer_state,
                                         load_training_state, read_tracker)
from mindformers_core.sharding import Layout
from tests.msrun_batch import job
from tests.bodies.checkpoint_body import expected_globals

pytestmark = pytest.mark.msrun


SAVE_4 = job("checkpoint_save_4", 4, "tests.bodies.checkpoint_body:run",
             lambda: {"directory": os.path.join(tempfile.mkdtemp(prefix="mfc_ckpt_"), "ckpt"), "step": 3},
             timeout=120, group=__name__)


def test_msrun_save_then_reshard_load():
    results = SAVE_4.results()
    d = SAVE_4.used_kwargs["directory"]
    assert [r["rank"] for r in results] == [0, 1, 2, 3] and all(r["world"] == 4 for r in results)
    assert all(r["path"] == os.path.join(d, "step_3") for r in results)
    assert read_tracker(d) == 3 and list_steps(d) == [3]
    assert not any(n.endswith(".tmp") for n in os.listdir(d))

    globals_ = expected_globals()
    full = load_checkpoint(d, checkpoint_specs(d))
    assert sorted(full) == sorted(globals_)
    for n, v in globals_.items():
        np.testing.assert_array_equal(full[n], v)

    tp4 = Layout((4,), ("tp",))
    targets = {n: (v.shape, tp4("tp", *["None"] * (v.ndim - 1))) for n, v in globals_.items()}
    for r in range(4):
        part = load_checkpoint(d, targets, r)
        moments = load_optimizer_state(d, targets, r)["exp_avg"]
        for n, v in globals_.items():
            want = v[targets[n][1].local_slice(v.shape, r)]
            np.testing.assert_array_equal(part[n], want)
            np.testing.assert_array_equal(moments[n], -want)
    state = load_training_state(d)
    assert state.trainer_state == {"step": 3, "seed": 1234}
    assert state.data_states == {r: {"rank": r, "consumed": 64} for r in range(4)}
