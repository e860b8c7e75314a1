"""Pure logic of the variable-count all-to-all (distributed/comm/exchange.py) and of the expert-parallel
path built on it (sharding/expert_parallel.py: routed_plan): offsets from a count matrix, the emulated
exchange against a direct per-pair copy, and the whole dispatch -> experts -> combine round trip simulated
in NumPy for P ranks, with uneven counts, zero-count chunks and every row on one expert."""
import numpy as np
import pytest

from mindformers_core.distributed.comm.exchange import (all_to_all_v_bytes, check_count_matrix,
                                                        emulated_all_to_all_v, receive_index)
from mindformers_core.sharding.expert_parallel import routed_plan


def _sends(matrix, width=3, seed=0):
    """Rank i's send rows grouped by destination; row values encode (source, destination, position)."""
    m = np.asarray(matrix)
    out = []
    for i in range(m.shape[0]):
        rows = [np.array([[i, j, t] + [0] * (width - 3) for t in range(m[i, j])], np.float32).reshape(-1, width)
                for j in range(m.shape[1])]
        out.append(np.concatenate(rows))
    return out


def _direct(sends, matrix):
    """What each rank must receive: for every source in order, that source's piece for it."""
    m = np.asarray(matrix)
    starts = np.cumsum(m, 1) - m
    return [np.concatenate([sends[j][starts[j, me]:starts[j, me] + m[j, me]] for j in range(m.shape[0])])
            for me in range(m.shape[0])]


@pytest.mark.parametrize("matrix", [
    [[2, 0], [3, 1]],                                # a zero-count chunk
    [[0, 5, 1, 0], [2, 0, 0, 0], [1, 1, 1, 1], [0, 0, 7, 0]],     # uneven, zeros on and off the diagonal
    [[4, 0, 0], [4, 0, 0], [4, 0, 0]],               # everything to rank 0
    [[0, 0], [0, 3]],                                # a rank that sends and receives nothing
])
def test_emulated_exchange_equals_direct_copy_and_round_trips(matrix):
    m = np.asarray(matrix)
    sends = _sends(m)
    got = emulated_all_to_all_v(sends, m)
    want = _direct(sends, m)
    for me in range(len(m)):
        assert got[me].shape == (m[:, me].sum(), 3)
        np.testing.assert_array_equal(got[me], want[me])
        assert all(tuple(r[:2]) in {(j, me) for j in range(len(m))} for r in got[me])
    back = emulated_all_to_all_v(got, m.T)          # the backward / inverse: the transposed counts
    for me in range(len(m)):
        np.testing.assert_array_equal(back[me], sends[me])


def test_receive_index_offsets():
    m = np.array([[1, 2, 0], [0, 0, 3], [2, 1, 1]])
    padded = 4                                      # largest send total
    assert receive_index(m, 0, padded).tolist() == [0, 8, 9]         # j=0 rows [0,1); j=2 rows [0,2)
    assert receive_index(m, 1, padded).tolist() == [1, 2, 10]        # j=0 rows [1,3); j=2 row 2
    assert receive_index(m, 2, padded).tolist() == [4, 5, 6, 11]     # j=1 rows [0,3); j=2 row 3
    b = all_to_all_v_bytes(m, 16, 2)
    assert b == {"sent": 3 * 16, "emulated": 3 * 4 * 16, "counts": 36}


def test_count_matrix_checked():
    with pytest.raises(ValueError, match=r"shape \(2, 3\); expected \(2, 2\)"):
        check_count_matrix(np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match="non-negative integers"):
        check_count_matrix([[1, -1], [0, 0]], 2)


def _simulate(experts_per_rank, topk, P, L):
    """Every rank's MoE layer through routed_plan + the emulated exchange, experts = a per-expert map."""
    E = P * L
    counts = np.stack([np.bincount(e, minlength=E) for e in experts_per_rank])
    tokens = [np.random.RandomState(r).standard_normal((len(e) // topk, 4)).astype(np.float32)
              for r, e in enumerate(experts_per_rank)]
    plans = [routed_plan(e, topk, counts, r, L) for r, e in enumerate(experts_per_rank)]
    matrix = plans[0]["matrix"]
    assert all(np.array_equal(p["matrix"], matrix) for p in plans)
    sends = [tokens[r][plans[r]["send_token"]] for r in range(P)]
    got = emulated_all_to_all_v(sends, matrix)
    outs = []
    for r in range(P):
        rows = got[r][plans[r]["by_expert"]]
        done = np.zeros_like(rows)
        for local, (a, b) in enumerate(plans[r]["expert_rows"]):
            done[a:b] = rows[a:b] * (r * L + local + 1)          # expert e multiplies by e + 1
        outs.append(done[plans[r]["by_source"]])
    back = emulated_all_to_all_v(outs, matrix.T)
    for r in range(P):
        mine = back[r][plans[r]["unsort"]].reshape(-1, topk, 4)
        want = tokens[r][:, None, :] * (experts_per_rank[r].reshape(-1, topk, 1) + 1).astype(np.float32)
        np.testing.assert_allclose(mine, want, rtol=0, atol=0)
    return counts, plans


def test_routed_round_trip_uneven_with_empty_experts():
    rng = np.random.RandomState(5)
    P, L, k = 4, 2, 2
    routed = [np.stack([rng.choice(P * L, k, replace=False) for _ in range(n)]).reshape(-1)
              for n in (5, 1, 7, 3)]
    routed[1] = np.array([6, 7])                      # rank 1: one token, to rank 3's experts only
    routed[3] = np.array([x if x not in (2, 3) else 0 for x in routed[3]])   # nobody else feeds rank 1 ...
    routed[0] = np.where(np.isin(routed[0], (2, 3)), 4, routed[0])
    routed[2] = np.where(np.isin(routed[2], (2, 3)), 5, routed[2])
    counts, plans = _simulate(routed, k, P, L)
    assert counts[:, 2:4].sum() == 0                  # ... so rank 1 receives nothing
    assert plans[1]["expert_rows"] == [(0, 0), (0, 0)]
    assert len(set(plans[0]["matrix"].sum(0).tolist())) > 1


def test_routed_round_trip_all_rows_on_one_expert():
    P, L, k = 2, 2, 1
    counts, plans = _simulate([np.full(6, 3), np.full(4, 3)], k, P, L)
    assert plans[0]["matrix"].tolist() == [[0, 6], [0, 4]]
    assert plans[1]["expert_rows"] == [(0, 0), (0, 10)]


def test_routed_plan_checks_its_row():
    with pytest.raises(ValueError, match="is not this rank's per-expert count"):
        routed_plan(np.array([0, 1]), 1, np.array([[1, 0], [0, 0]]), 0, 1)


# ---- the graph-mode variable path's index logic (sharding/expert_parallel.py: routed_graph) ------------------
@pytest.mark.parametrize("experts, ids", [
    (4, [2, 0, 2, 3, 0, 2, 1, 2]),            # uneven, token order within an expert
    (4, [3, 3, 3, 3]),                         # every row on one expert, the others empty
    (8, [5, 1, 7, 0, 0, 6, 1, 2, 3, 4]),
])
def test_sort_rows_by_expert_is_the_stable_sort(experts, ids):
    """Integer permutation (no float sort keys) = NumPy's stable argsort by expert; slot inverts order."""
    from mindspore import Tensor
    from mindformers_core.sharding.expert_parallel import sort_rows_by_expert
    e = np.array(ids, np.int32)
    slot, order, counts = sort_rows_by_expert(Tensor(e), experts)
    want = np.argsort(e, kind="stable")
    np.testing.assert_array_equal(order.asnumpy(), want)
    np.testing.assert_array_equal(slot.asnumpy()[want], np.arange(e.size))
    np.testing.assert_array_equal(counts.asnumpy(), np.bincount(e, minlength=experts))


@pytest.mark.parametrize("matrix", [
    [[1, 0, 2, 3], [0, 0, 6, 0]],             # an empty expert per source, everything on one expert
    [[2, 2, 2, 2], [8, 0, 0, 0]],
    [[0, 3, 0], [1, 1, 1], [3, 0, 0]],
])
def test_expert_of_sorted_rows_from_the_count_matrix(matrix):
    """Every place of the all-gathered (P, R) send buffers maps to the expert whose rows fill it: the same as
    repeating each expert id by its count, per source."""
    from mindspore import Tensor
    from mindformers_core.sharding.expert_parallel import expert_of_sorted_rows
    m = np.array(matrix, np.int32)
    rows = int(m.sum(1).max())
    assert all(int(r.sum()) == rows for r in m)          # every source sends all its R rows
    got = expert_of_sorted_rows(Tensor(m), rows).asnumpy()
    want = np.concatenate([np.repeat(np.arange(m.shape[1]), r) for r in m])
    np.testing.assert_array_equal(got, want)
