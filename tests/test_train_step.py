"""The step assembler's pure parts (training/steps.py): the batch is a tuple of tensors in the model's
argument order, micro-steps slice every one of them, a pipeline takes (ids, labels) only; and the one
reduce -> clip -> guard -> update (optim.GradientUpdate) in both of its forms."""
import math

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.optim import AdamW, ClipGradNorm, GradientUpdate, StepGuard
from mindformers_core.training.steps import PIPELINE_BATCH, check_pipeline_batch, micro_slices


def test_micro_slices_cut_every_batch_tensor_along_dim_0():
    ids = Tensor(np.arange(24).reshape(6, 4).astype(np.int32))
    labels = ids + 1
    mask = Tensor(np.ones((6, 4), np.float32))
    slices = list(micro_slices((ids, labels, mask), 3))
    assert len(slices) == 3 and all(len(s) == 3 for s in slices)
    for i, (a, b, c) in enumerate(slices):
        np.testing.assert_array_equal(a.asnumpy(), ids.asnumpy()[2 * i:2 * i + 2])
        np.testing.assert_array_equal(b.asnumpy(), labels.asnumpy()[2 * i:2 * i + 2])
        assert tuple(c.shape) == (2, 4)
    (whole,) = list(micro_slices((ids, labels), 1))
    np.testing.assert_array_equal(whole[1].asnumpy(), labels.asnumpy())


def test_a_pipeline_names_the_batch_keys_it_cannot_feed():
    check_pipeline_batch(PIPELINE_BATCH)
    with pytest.raises(ValueError, match=r"'loss_mask', 'position_ids'") as e:
        check_pipeline_batch(("input_ids", "labels", "loss_mask", "position_ids"))
    assert "pipeline_stage" in str(e.value)


class _Pass(nn.Cell):
    def construct(self, grads, loss):
        return grads, loss


def _update(guard=None, clip=True):
    p = Parameter(Tensor(np.ones((3,), np.float32)), name="w")
    opt = AdamW([p], 0.1)
    return p, GradientUpdate(_Pass(), opt, ClipGradNorm(math.inf) if clip else None, guard)


def test_the_update_order_in_a_graph_and_on_the_host():
    loss = Tensor(np.float32(2.0))
    good = (Tensor(np.full((3,), 0.5, np.float32)),)
    bad = (Tensor(np.array([np.nan, 0.0, 0.0], np.float32)),)
    for run in ("construct", "eager"):
        p, update = _update(StepGuard(True))
        step = update if run == "construct" else update.eager
        out_loss, norm, _ = step(good, loss)
        assert float(out_loss) == 2.0 and float(norm) == pytest.approx(math.sqrt(3 * 0.25))
        after = p.asnumpy().copy()
        assert (after < 1).all()                                               # updated
        _, norm, _ = step(bad, loss)
        assert math.isnan(float(norm))
        np.testing.assert_array_equal(p.asnumpy(), after)                      # skipped
    _, update = _update(clip=False)
    assert update(good, loss)[1] is None
    with pytest.raises(ValueError, match="step_guard reads the global gradient norm"):
        _update(StepGuard(True), clip=False)
    p = Parameter(Tensor(np.ones((3,), np.float32)), name="v")
    tensors = GradientUpdate(_Pass(), AdamW([p], 0.1), None, None, tensor_outputs=True)
    assert float(tensors(good, loss)[1]) == 2.0    # the loss stands for the norm: every output a Tensor
    assert ops.isfinite(p.value()).all()
