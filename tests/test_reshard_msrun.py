"""DTensor reshard executed with real collectives on 4 and 8 msrun ranks: random layout pairs
(including partial sources and targets), PyNative and ms.jit, and a pipeline-stage hand-off."""
import pytest

from tests.msrun_batch import job

pytestmark = pytest.mark.msrun


def _check(results, count, jit_count):
    for rank, entries in enumerate(results):
        cases = [e for e in entries if "src" in e]
        assert len(cases) == count
        assert sum("jit_err" in e for e in cases) == jit_count
        for e in cases:
            for key in ("full_err", "local_err", "jit_err"):
                if key in e:
                    assert e[key] <= 1e-6, f"rank {rank}: {e['src']} -> {e['dst']} {e['shape']} " \
                                           f"steps {e['steps']}: {key}={e[key]}"
    kinds = {k for entries in results for e in entries if "steps" in e for k in e["steps"]}
    return kinds


RESHARD_4 = job("reshard_4", 4, "tests.bodies.reshard_body:run",
                {"device_matrix": [2, 2], "alias": ["dp", "tp"], "count": 12, "jit_count": 3},
                timeout=400, group=__name__)
RESHARD_8 = job("reshard_8", 8, "tests.bodies.reshard_body:run",
                {"device_matrix": [2, 2, 2], "alias": ["pp", "dp", "tp"], "count": 5, "jit_count": 1, "seed": 1},
                timeout=600, group=__name__)


def test_reshard_4_ranks_2x2_mesh():
    results = RESHARD_4.results()
    kinds = _check(results, 12, 3)
    assert {"all_gather", "all_to_all", "reduce_scatter"} <= kinds
    handoff = [e for entries in results for e in entries if "p2p" in e]
    assert [e["p2p"] for e in handoff] == ["sent", "sent", "received", "received"]
    assert all(e["err"] == 0.0 and e["steps"][-1] == "p2p" for e in handoff if e["p2p"] == "received")


def test_reshard_8_ranks_2x2x2_mesh():
    results = RESHARD_8.results()
    kinds = _check(results, 5, 1)
    assert len(kinds) >= 3
