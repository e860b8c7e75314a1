"""The shared-memory gradient sum (distributed/comm/host_sum.py) that dp's step uses on one host: under msrun
(2 and 4 workers, in the suite's batched launches) it equals the float32 sum in rank order bitwise, with 2
ranks bitwise MindSpore's AllReduce, over repeated calls (the counters) and for a 2-rank group inside 4
ranks; a NaN factor on one rank reaches every rank (MFC_FAULT "nan" on one rank skips the step
everywhere). The trainer's dp parity with it is proven by the trainer's msrun tests (it is the default)."""
import numpy as np
import pytest

from tests.msrun_batch import job

SHAPES = [(3, 5), (7,), (2, 2, 3)]
CALLS = 3


def _arrays(rank, call):
    rng = np.random.default_rng(100 * call + rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def sums():
    """msrun body: for the world and (with 4 ranks) this rank's pair {r, r ^ 2}, ``CALLS`` sums, each
    against the float32 sum of every member's arrays in rank order; then one rank's NaN factor."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.distributed import init_distributed
    from mindformers_core.distributed.comm.host_sum import HostSum, host_sum_applies
    env = init_distributed()
    groups = [tuple(range(env.world_size))] + ([tuple(sorted({env.rank, env.rank ^ 2}))] if env.world_size == 4 else [])
    out = {"applies": [host_sum_applies(g, [ms.float32]) for g in groups], "exact": [], "mccl_equal": None}
    for ranks in groups:
        summer = HostSum(ranks, SHAPES)
        for call in range(CALLS):
            got = [t.asnumpy() for t in summer([Tensor(a) for a in _arrays(env.rank, call)])]
            want = _arrays(ranks[0], call)
            for r in ranks[1:]:
                want = [w + a for w, a in zip(want, _arrays(r, call))]
            out["exact"].append(all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want)))
        if len(ranks) == 2 and env.world_size == 2:
            from mindformers_core.distributed.comm import kernels as K
            from mindformers_core.distributed.process_group import world_group
            reduce = K.AllReduceKernel(world_group(), "sum")
            mine = _arrays(env.rank, 0)
            out["mccl_equal"] = all(np.array_equal(reduce(Tensor(a)).asnumpy(), g.asnumpy())
                                    for a, g in zip(mine, summer([Tensor(a) for a in mine])))
        poisoned = summer([Tensor(a) for a in _arrays(env.rank, 9)], float("nan") if env.rank == ranks[-1] else 1.0)
        out.setdefault("nan_everywhere", []).append(all(np.isnan(t.asnumpy()).all() for t in poisoned))
    return out


TWO = job("host_sum_2", 2, "tests.test_host_sum:sums", timeout=200, group=__name__)
FOUR = job("host_sum_4", 4, "tests.test_host_sum:sums", timeout=200, group=__name__)


@pytest.mark.msrun
@pytest.mark.parametrize("launch, groups", [(TWO, 1), (FOUR, 2)])
def test_the_shared_memory_sum_is_the_rank_order_sum_on_every_rank(launch, groups):
    results = launch.results()
    for r in results:
        assert r["applies"] == [True] * groups
        assert r["exact"] == [True] * (CALLS * groups)
        assert r["nan_everywhere"] == [True] * groups
    if groups == 1:
        assert [r["mccl_equal"] for r in results] == [True, True]


def test_the_switch_and_a_rank_outside_the_group():
    # an environment of its own: the suite's background launches inherit this process's os.environ
    from mindformers_core.distributed.comm.host_sum import HostSum, host_sum_enabled
    assert host_sum_enabled({}) and host_sum_enabled({"MFC_HOST_SUM": "1"})
    assert not host_sum_enabled({"MFC_HOST_SUM": "0"})
    with pytest.raises(ValueError, match=r"rank 0 is not among ranks=\[1, 2\]"):
        HostSum((1, 2), SHAPES)


def test_not_on_hosts_without_ordered_stores(monkeypatch):
    """The counters order the slots' writes only under x86-64's total store order: on aarch64 (weaker
    ordering, no fence from Python) the step keeps MindSpore's all-reduce."""
    import mindspore as ms
    from mindformers_core.distributed.comm import host_sum
    monkeypatch.setattr(host_sum.platform, "machine", lambda: "aarch64")
    assert not host_sum.host_sum_applies((0, 1), [ms.float32])
