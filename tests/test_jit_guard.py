"""The guard that fails tests whose jit functions recompile at every call (tests/conftest.py and
the msrun worker install it)."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, log

from mindformers_core.testing.jit_guard import ConstantTupleGuard, install_guard


def _forget_warnings():
    for handler in log._get_logger().handlers:
        if isinstance(handler, ConstantTupleGuard):
            handler.seen.clear()


def test_tuple_of_tensors_recompiles_and_is_caught_mutable_is_not():
    guard = install_guard()
    try:
        @ms.jit
        def total(parts, scale):
            return (parts[0] + parts[1]) * scale

        def call(wrap):
            out = []
            for k in range(3):
                parts = (Tensor(np.full((2,), k, np.float32)), Tensor(np.ones((2,), np.float32)))
                out.append(float(total(wrap(parts), Tensor(2.0)).asnumpy()[0]))
            return out
        assert call(ms.mutable) == [2.0, 4.0, 6.0]
        assert guard.seen == []
        assert call(tuple) == [2.0, 4.0, 6.0]    # right values, but a compile per call
        assert guard.seen and "ms.mutable" in guard.report()
    finally:
        log._get_logger().removeHandler(guard)
        _forget_warnings()
