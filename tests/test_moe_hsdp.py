"""hsdp's expert domain (one process, no groups): the shard size of expert parameters over their
expert-data-parallel group follows the dp shard groups, or a named error."""
import pytest

from mindformers_core.hsdp.plan import domain_shard_size


@pytest.mark.parametrize("shard_size, dp, edp, want", [
    (4, 4, 2, 2),     # full ZeRO over dp4 = edp2 x ep2: experts sharded over both edp ranks
    (2, 4, 2, 1),     # shard groups of 2 consecutive dp ranks = one edp index, both ep ranks: experts whole
    (2, 2, 1, 1),     # dp2 x ep2: a one-rank edp group
    (8, 8, 2, 2),     # ep4: 8 consecutive dp ranks hold 2 edp indices
    (4, 8, 2, 1),     # 4 consecutive dp ranks = one edp index of ep4
    (1, 8, 4, 1),     # pure data parallel
])
def test_expert_shard_size_stays_inside_the_dp_shard_groups(shard_size, dp, edp, want):
    assert domain_shard_size(shard_size, dp, edp) == want


def test_expert_shard_size_that_would_split_an_expert_copy_is_named():
    with pytest.raises(ValueError, match=r"hsdp: shard_size=2 with expert parallel size 3 \(the expert parameters "
                                         r"are replicated over 2 of the 6 data-parallel ranks\)"):
        domain_shard_size(2, 6, 2)
    with pytest.raises(ValueError, match="does not divide the data-parallel size 4"):
        domain_shard_size(2, 4, 3)
