"""Outside msrun: a one-process world where every collective is the identity (PyNative and jit),
and init/destroy are idempotent."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor

from mindformers_core.distributed import (destroy_distributed, get_env, init_distributed,
                                          launched_by_msrun, world_group)
from mindformers_core.distributed import comm


def test_fallback_world_and_idempotent_init():
    assert not launched_by_msrun()
    env = init_distributed()
    assert init_distributed() is env
    assert (env.rank, env.world_size, env.backend, env.is_distributed) == (0, 1, None, False)
    assert world_group().size == 1
    destroy_distributed()
    destroy_distributed()  # safe twice
    again = init_distributed()
    assert again == env and again is not env
    with pytest.raises(ValueError, match="device_target='TPU' is not supported"):
        destroy_distributed()
        init_distributed("TPU")
    init_distributed()


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_collectives_are_identity_on_one_rank(mode):
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))

    def loss(x):
        y = (comm.all_reduce(x, "sum") + comm.all_reduce(x, "max") + comm.all_gather(x, 1)
             + comm.reduce_scatter(x, 0) + comm.all_to_all(x, 0, 1) + comm.broadcast(x, 0)
             + comm.copy_to_region(x) + comm.reduce_from_region(x) + comm.scatter_to_region(x)
             + comm.gather_from_sequence_parallel_region(x))
        return (y * y).sum(), y

    step = ms.value_and_grad(loss, has_aux=True)
    if mode == "jit":
        step = ms.jit(step)
    (value, y), grad = step(x)
    np.testing.assert_allclose(y.asnumpy(), 10 * x.asnumpy())
    np.testing.assert_allclose(grad.asnumpy(), 2 * 10 * 10 * x.asnumpy())
    assert get_env().world_size == 1
