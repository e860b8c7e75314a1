"""The msrun harness: results per rank, failures with every rank's log, deadlines, no orphans."""
import time

import psutil
import pytest

from mindformers_core.testing import MsrunError, run_msrun
from tests.msrun_batch import job

pytestmark = pytest.mark.msrun
# a job of the suite's 2-rank batch (tests/msrun_batch.py): the batch hands it to run_msrun like every
# other body, so this checks the same collection path without a launch of its own (~11 s on 2 cores)
ECHO = job("harness_echo", 2, "tests.bodies.harness_body:echo", {"value": [1, 2]}, timeout=120, group=__name__)


def test_results_are_collected_per_rank():
    results = ECHO.results()
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["value"] == [1, 2] for r in results)
    assert results[0]["pid"] != results[1]["pid"]


# launches of their own (no batched job): they run beside the batched launches (tests/conftest.py)
@pytest.mark.beside_batch
def test_failure_shows_each_rank_log():
    with pytest.raises(MsrunError) as info:
        run_msrun("tests.bodies.harness_body:fail_on", 2, kwargs={"rank": 1}, timeout=120)
    text = str(info.value)
    assert "boom from rank 1" in text
    assert "--- rank 0" in text and "--- rank 1" in text
    assert "no result from ranks [1]" in text or "exit" in text


@pytest.mark.beside_batch
def test_deadline_kills_the_whole_tree(tmp_path):
    """A 30 s deadline: the workers are up in ~6 s on a quiet 2-core machine, so both have written their
    pid (asserted below) before the deadline kills the tree (12 s was too short in a full-suite run:
    one worker had not started; 30 s since the test runs beside the suite's batched launches)."""
    start = time.monotonic()
    with pytest.raises(MsrunError, match="exceeded 30s and was killed"):
        run_msrun("tests.bodies.harness_body:hang_on", 2,
                  kwargs={"rank": 1, "marker": str(tmp_path)}, timeout=30)
    assert time.monotonic() - start < 60
    pids = [int(p.read_text()) for p in tmp_path.glob("pid_*")]
    assert len(pids) == 2, f"workers never started (pid files: {pids})"
    time.sleep(1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphan workers left running: {alive}"


def test_bad_arguments():
    with pytest.raises(ValueError, match="target='nocolon'"):
        run_msrun("nocolon", 2)
    with pytest.raises(ValueError, match="nproc=0"):
        run_msrun("a:b", 0)
