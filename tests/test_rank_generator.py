"""RankGenerator against the design's worked example, brute force over orders, and bad input."""
import itertools

import pytest

from mindformers_core.distributed import RankGenerator


def test_worked_example_tp2_dp3_pp4():
    gen = RankGenerator(tp=2, ep=1, dp=3, pp=4, cp=1, order="tp-dp-pp")
    assert gen.get_ranks("dp") == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11],
                                   [12, 14, 16], [13, 15, 17], [18, 20, 22], [19, 21, 23]]
    assert gen.get_ranks("tp") == [[2 * i, 2 * i + 1] for i in range(12)]
    assert gen.get_ranks("pp") == [[0, 6, 12, 18], [1, 7, 13, 19], [2, 8, 14, 20],
                                   [3, 9, 15, 21], [4, 10, 16, 22], [5, 11, 17, 23]]
    assert gen.get_ranks("tp-dp") == [list(range(6 * p, 6 * p + 6)) for p in range(4)]
    assert gen.get_ranks("tp-pp")[0] == [0, 1, 6, 7, 12, 13, 18, 19]


def _brute_force(sizes, order, token):
    """Group ranks by their coordinates outside ``token`` (first order token varies fastest)."""
    names = order.split("-")
    dims = [sizes[n] for n in names]
    wanted = token.split("-")
    groups = {}
    for coord in itertools.product(*[range(d) for d in reversed(dims)]):
        coord = tuple(reversed(coord))  # coord[i] belongs to names[i]
        rank, stride = 0, 1
        for c, d in zip(coord, dims):
            rank += c * stride
            stride *= d
        key = tuple(c for n, c in zip(names, coord) if n not in wanted)
        inner = tuple(c for n, c in zip(names, coord) if n in wanted)
        groups.setdefault(key, []).append((inner[::-1], rank))
    return sorted([r for _, r in sorted(g)] for g in groups.values())


ORDERS = ["tp-cp-ep-dp-pp", "tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp", "cp-tp-pp-dp"]
SIZES = [dict(tp=2, cp=1, ep=1, dp=3, pp=2), dict(tp=4, cp=2, ep=1, dp=1, pp=2),
         dict(tp=1, cp=1, ep=2, dp=2, pp=3)]
# a size > 1 missing from the order is an error (tested below), so only valid pairs here
VALID = [(o, s) for o in ORDERS for s in SIZES
         if all(v == 1 or n in o.split("-") for n, v in s.items())]


@pytest.mark.parametrize("order, sizes", VALID)
def test_groups_match_coordinate_arithmetic(order, sizes):
    gen = RankGenerator(order=order, **sizes)
    full = "-".join(gen.ordered_names)
    for k in range(1, 4):
        for combo in itertools.combinations(gen.ordered_names, k):
            token = "-".join(combo)
            got = gen.get_ranks(token)
            assert sorted(got) == _brute_force(sizes, full, token), token
            assert sorted(r for g in got for r in g) == list(range(gen.world_size))


def test_coordinate_round_trip():
    gen = RankGenerator(tp=2, ep=1, dp=3, pp=4, cp=1, order="tp-dp-pp")
    assert gen.coordinate(7) == {"tp": 1, "dp": 0, "pp": 1, "cp": 0, "ep": 0}
    with pytest.raises(ValueError, match="rank 24 is outside"):
        gen.coordinate(24)


def test_rank_offset_shifts_every_group():
    gen = RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order="tp-dp", rank_offset=8)
    assert gen.get_ranks("dp") == [[8, 10], [9, 11]]


def test_missing_size_from_order_is_an_error():
    with pytest.raises(ValueError, match=r"pp=2 > 1 but 'pp' is missing from order='tp-dp'"):
        RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp")


def test_ep_and_cp_together_is_an_error():
    with pytest.raises(ValueError, match="ep=2 and cp=2 are both > 1"):
        RankGenerator(tp=1, ep=2, dp=1, pp=1, cp=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=0, ep=1, dp=1, pp=1, cp=1), "tp=0 must be a positive integer"),
    (dict(tp=1, ep=1, dp=1, pp=1, cp=1, order="tp-xx"), r"unknown token\(s\) \['xx'\]"),
    (dict(tp=1, ep=1, dp=1, pp=1, cp=1, order="tp-tp"), "repeats a token"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RankGenerator(**kwargs)


def test_unknown_group_token():
    with pytest.raises(ValueError, match="token='tq'"):
        RankGenerator(tp=2, ep=1, dp=1, pp=1, cp=1).get_ranks("tq")
