"""Every collective and autograd pair under real msrun workers, against NumPy references:
world group and 2x2-mesh subgroups, 2 and 4 ranks, float32/float16, PyNative and ms.jit,
native and emulated kernels; point-to-point between every pair of ranks."""
import itertools

import numpy as np
import pytest

from tests.msrun_batch import job
from tests.bodies.comm_body import OPS
from tests.comm_reference import backward, forward

pytestmark = pytest.mark.msrun
TOL = {"float32": dict(rtol=1e-6, atol=1e-6), "float16": dict(rtol=2e-3, atol=2e-3)}

# Each case compiles 18 collectives (forward + backward) under jit: keep the list lean.
# CPU subgroups are always emulated, the world group has native all_gather/broadcast, and
# "emulate" forces the AllReduce-SUM path on the world group too.
CASES_2 = ([["world", "float32", mode, emu] for mode in ("pynative", "jit") for emu in (False, True)]
           + [["world", "float16", mode, False] for mode in ("pynative", "jit")])
CASES_4 = ([["world", "float32", "pynative", False], ["world", "float32", "pynative", True]]
           + [["tp", "float32", "pynative", False], ["dp", "float32", "jit", False], ["tp", "float16", "pynative", False]])
# (tp float32 jit is not run: the subgroup kernel is the same emulated one for tp and dp groups, and
# float32 under jit on a 4-rank mesh subgroup is the dp case; float16 on a subgroup runs eagerly (its cast is
# the same in both modes: the 2-rank world group's float16 runs under jit), and the tp membership is checked on
# the PyNative cases. The world group's forced emulation runs eagerly: under jit
# on 4 ranks it is the emulated kernel the dp case compiles, and it is compiled on the 2-rank world group)


# Point-to-point: every pair of 4 ranks eagerly, one pair each way under jit (2 ranks): the jit path compiles one
# graph per pair (~2 s each on 4 ranks sharing 2 cores), and the peer is the same argument of the same kernel in both
# modes, so the eager run checks the routing between every pair
COMM_2 = job("comm_2", 2, "tests.bodies.comm_body:run", {"cases": CASES_2, "p2p_modes": ["jit"]}, timeout=400,
             group=__name__)
COMM_4 = job("comm_4", 4, "tests.bodies.comm_body:run",
             {"cases": CASES_4, "mesh_shape": [2, 2], "parallel_state": True, "p2p_modes": ["pynative"]},
             timeout=600, group=__name__)


@pytest.fixture(scope="module")
def ranks2():
    return COMM_2.results()


@pytest.fixture(scope="module")
def ranks4():
    return COMM_4.results()


def _check_cases(results, cases):
    checked = 0
    for case in cases:
        key = tuple(case)
        per_rank = [r["cases"][key] for r in results]
        by_group = {}
        for c in per_rank:
            by_group.setdefault(tuple(c["ranks"]), []).append(c)
        for ranks, members in by_group.items():
            assert len(members) == len(ranks), f"{key}: group {ranks} reported by {len(members)} ranks"
            src = len(ranks) - 1  # broadcast source: last rank of the group
            for k, name in enumerate(OPS):
                xs = [m["inputs"][k] for m in members]
                ws = [m["weights"][k] for m in members]
                fwd, bwd = forward(name, xs, src), backward(name, xs, ws, src)
                for i, m in enumerate(members):
                    np.testing.assert_allclose(m["outputs"][k].astype(np.float64), fwd[i], **TOL[case[1]],
                                               err_msg=f"{key} {name} forward, group {ranks} member {i}")
                    np.testing.assert_allclose(m["grads"][k].astype(np.float64), bwd[i], **TOL[case[1]],
                                               err_msg=f"{key} {name} backward, group {ranks} member {i}")
                    checked += 1
    return checked


def test_collectives_2_ranks(ranks2):
    assert _check_cases(ranks2, CASES_2) == len(CASES_2) * len(OPS) * 2


def test_collectives_4_ranks_world_and_subgroups(ranks4):
    assert _check_cases(ranks4, CASES_4) == len(CASES_4) * len(OPS) * 4


def test_native_and_emulated_paths_both_ran(ranks2):
    """On CPU all_gather/broadcast on the world group are native; forcing emulation switches."""
    native = ranks2[0]["cases"][("world", "float32", "pynative", False)]["native"]
    emulated = ranks2[0]["cases"][("world", "float32", "pynative", True)]["native"]
    assert native["all_gather"] and native["broadcast"]
    assert not any(emulated.values())


def test_subgroup_membership(ranks4):
    tp = {r["rank"]: r["cases"][("tp", "float32", "pynative", False)]["ranks"] for r in ranks4}
    dp = {r["rank"]: r["cases"][("dp", "float32", "jit", False)]["ranks"] for r in ranks4}
    assert tp == {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    assert dp == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


@pytest.mark.parametrize("world, mode", [(4, "pynative"), (2, "jit")])
def test_point_to_point_every_pair(request, world, mode):
    by_rank = {r["rank"]: r["p2p"][mode] for r in request.getfixturevalue(f"ranks{world}")}
    pairs = list(itertools.permutations(range(world), 2))
    for src, dst in pairs:
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * src + dst
        w = np.full((2, 3), 1.0 + src + 0.5 * dst, np.float32)
        received = by_rank[dst][(src, dst, "recv")]
        np.testing.assert_array_equal(received["received"], 2.0 * x, err_msg=f"{src}->{dst} {mode}")
        np.testing.assert_array_equal(received["grad"], np.zeros_like(x))
        # the sender's gradient came back from the receiver: d<2x, w>/dx = 2w
        np.testing.assert_array_equal(by_rank[src][(src, dst, "send")]["grad"], 2.0 * w,
                                      err_msg=f"{src}->{dst} {mode} backward")
    assert sum(len(v) for v in by_rank.values()) == 2 * len(pairs)


def test_async_handles_and_barrier(ranks4):
    for r in ranks4:
        np.testing.assert_array_equal(r["async"]["async_sum"], np.full((3,), 10.0, np.float32))
        prev = (r["rank"] - 1) % 4
        np.testing.assert_array_equal(r["async"]["ring_recv"], np.full((3,), prev + 1.0, np.float32))


def test_bad_input_is_rejected_with_clear_errors(ranks2):
    errors = ranks2[0]["bad_input"]
    assert "size 3 of dim 0" in errors["reduce_scatter"] and "group size 2" in errors["reduce_scatter"]
    assert "size 3 of dim 1" in errors["all_to_all"]
    assert "op='prod'" in errors["all_reduce"] and "'max'" in errors["all_reduce"]
    assert "src=99" in errors["broadcast"]
    assert "dst=0" in errors["send"]


def test_parallel_state_groups_under_msrun(ranks4):
    """tp=2, pp=2 on 4 ranks with the default order tp-cp-ep-dp-pp."""
    for r in ranks4:
        ps, rank = r["parallel_state"], r["rank"]
        assert ps["tp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert ps["pp"] == [rank % 2, rank % 2 + 2]
        assert ps["dp"] == [rank] and ps["dp_size"] == 1
        assert ps["mp"] == [0, 1, 2, 3]
        assert (ps["tp_rank"], ps["pp_rank"]) == (rank % 2, rank // 2)
        assert ps["first"] == (rank < 2) and ps["last"] == (rank >= 2)
        assert ps["embedding"] == ps["pp"]
        assert ps["next"] == ps["pp"][(ps["pp_rank"] + 1) % 2]
        assert ps["tp_sum"] == sum(ps["tp"]) and ps["pp_sum"] == sum(ps["pp"])
