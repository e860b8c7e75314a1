"""common/graphs.py: compile_blocking gives ms.jit's results with the launch in the calling thread."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindformers_core.common.graphs import BLOCKING_ENV, blocking_launch_enabled, compile_blocking


def test_switch_reads_the_environment_and_names_bad_values():
    assert blocking_launch_enabled({}) and blocking_launch_enabled({BLOCKING_ENV: "1"})
    assert not blocking_launch_enabled({BLOCKING_ENV: "0"})
    with pytest.raises(ValueError, match=r"MFC_JIT_BLOCKING='yes'.*must be 0"):
        blocking_launch_enabled({BLOCKING_ENV: "yes"})


@pytest.mark.parametrize("blocking", ["1", "0"])
def test_same_outputs_and_side_effects_as_ms_jit(monkeypatch, blocking):
    """A training-step shape: value_and_grad, an in-graph parameter update, nested tuple outputs."""
    monkeypatch.setenv(BLOCKING_ENV, blocking)
    net = nn.Dense(4, 3)
    w0 = net.weight.asnumpy().copy()

    def objective(x):
        return (net(x) ** 2).sum()
    grad_fn = ms.value_and_grad(objective, None, net.trainable_params())

    def step(x):
        loss, grads = grad_fn(x)
        ops.assign(net.weight, net.weight - 0.1 * grads[0])
        return loss, (grads[0], grads[1] * 2)

    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    fn = compile_blocking(step)
    loss, (gw, gb2) = fn(x)
    y = x.asnumpy() @ w0.T + net.bias.asnumpy()
    np.testing.assert_allclose(loss.asnumpy(), (y ** 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(gw.asnumpy(), 2 * y.T @ x.asnumpy(), rtol=1e-5)
    np.testing.assert_allclose(gb2.asnumpy(), 4 * y.sum(0), rtol=1e-5)
    np.testing.assert_allclose(net.weight.asnumpy(), w0 - 0.1 * gw.asnumpy(), rtol=1e-6)
    assert getattr(fn, "blocking", False) == (blocking == "1")


class _DataDependent(nn.Cell):
    """Stands for a Cell whose compiled graph has data-dependent shapes (e.g. ExpertParallelExperts on its
    variable-count path)."""

    def __init__(self, dynamic):
        super().__init__()
        self.dynamic_shapes_under_jit = dynamic

    def construct(self, x):
        rows = ops.nonzero(x > 0).reshape(-1)
        return ops.gather(x, rows, 0).sum()


@pytest.mark.parametrize("dynamic", [True, False])
def test_graphs_with_data_dependent_shapes_keep_mindspores_launch(monkeypatch, dynamic):
    """compile_blocking(fn, cells=...) is plain ms.jit when a Cell below ``cells`` declares data-dependent
    shapes (common/graphs.py: the blocking launch gave wrong gradients there); results unchanged."""
    from mindformers_core.common.graphs import holds_dynamic_shapes
    monkeypatch.setenv(BLOCKING_ENV, "1")
    model = nn.SequentialCell([nn.Identity(), _DataDependent(dynamic)])
    assert holds_dynamic_shapes([model]) == dynamic and not holds_dynamic_shapes([])

    def total(x):
        return model(x)
    fn = compile_blocking(total, cells=[model])
    assert getattr(fn, "blocking", False) == (not dynamic)
    x = Tensor(np.array([1.0, -2.0, 3.0, 0.0], np.float32))
    assert float(fn(x).asnumpy()) == 4.0


def test_eager_default_reads_the_environment(monkeypatch):
    """eager_ops_in_calling_thread: MFC_PYNATIVE_SYNC=0 leaves MindSpore's setting alone, a bad value is named,
    and on CPU (unset or 1) eager ops run in the calling thread."""
    from mindformers_core.common.graphs import eager_ops_in_calling_thread
    before = ms.get_context("pynative_synchronize")
    try:
        ms.set_context(pynative_synchronize=False)
        monkeypatch.setenv("MFC_PYNATIVE_SYNC", "0")
        assert eager_ops_in_calling_thread() is False and ms.get_context("pynative_synchronize") is False
        monkeypatch.setenv("MFC_PYNATIVE_SYNC", "yes")
        with pytest.raises(ValueError, match=r"MFC_PYNATIVE_SYNC='yes'.*must be 0"):
            eager_ops_in_calling_thread()
        monkeypatch.delenv("MFC_PYNATIVE_SYNC")
        monkeypatch.setenv("MFC_DEVICE_TARGET", "CPU")
        assert eager_ops_in_calling_thread() is True and ms.get_context("pynative_synchronize") is True
    finally:
        ms.set_context(pynative_synchronize=before)
