"""Every local kernel a rule can select is registered next to its rule (rules.register_local_kernel) and
looked up by parallelize; an unregistered one is "not implemented"."""
import pytest

from mindformers_core.sharding import parallelizer  # noqa: F401  (registers every kernel)
from mindformers_core.sharding.rules import registry
from mindformers_core.sharding.rules.registry import (KernelError, LocalKernelEntry, local_kernel,
                                                      register_local_kernel, register_shape_from_input)


def test_the_kernels_the_rules_select_are_registered():
    assert {"vocab_parallel_lookup", "vocab_parallel_cross_entropy", "context_parallel_attention",
            "expert_parallel", "reshape", "broadcast_to"} <= set(registry.registered_local_kernels())
    assert local_kernel("reshape").shape_from_input and local_kernel("reshape").factory is None
    assert callable(local_kernel("expert_parallel").factory)
    assert local_kernel("strided_slice") is None     # selected by the slicing rule, not implemented


def test_registration(monkeypatch):
    monkeypatch.setattr(registry, "_KERNELS", {})

    @register_local_kernel("mine")
    def factory(site):
        raise KernelError("no")
    assert local_kernel("mine") == LocalKernelEntry("mine", factory)
    register_local_kernel("mine")(factory)            # the same factory again: fine
    with pytest.raises(ValueError, match="'mine' is already registered"):
        register_local_kernel("mine")(lambda site: None)
    register_shape_from_input("view")
    assert local_kernel("view").shape_from_input
