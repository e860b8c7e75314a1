"""scripts/msrun_launcher.sh: MindFormers' argument order, clear errors, a real 2-worker launch."""
import os
import subprocess

import pytest

from mindformers_core.testing import free_port
from mindformers_core.testing.msrun import child_env, kill_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "scripts", "msrun_launcher.sh")

WORKER = """
import os, sys
from mindformers_core.distributed import init_distributed
env = init_distributed()
with open(os.path.join(sys.argv[2], f"rank{env.rank}.txt"), "w") as f:
    f.write(f"{env.rank}/{env.world_size} {sys.argv[1]}")
"""


def _launch(args, timeout=120):
    """Run the launcher; past ``timeout`` kill msrun and its workers (no orphans) and fail."""
    proc = subprocess.Popen(["bash", LAUNCHER] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"launcher exceeded {timeout}s and was killed\n{out}\n{err}")
    finally:
        kill_tree(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.msrun
@pytest.mark.beside_batch      # deadlines of 60 / 120 s for a 2-worker start-up
def test_launches_two_workers_with_arguments(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    res = _launch([f"{script} hello {out}", "2", str(free_port()), str(tmp_path / "logs"), "True", "60"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.read_text() for p in out.iterdir()) == ["0/2 hello", "1/2 hello"]
    assert (tmp_path / "logs" / "worker_1.log").exists()


@pytest.mark.parametrize("args, message", [
    (["missing_script.py"], "script 'missing_script.py' not found"),
    (["{script}", "0"], "WORKER_NUM='0' must be a positive integer"),
    (["{script}", "2", "80"], "MASTER_PORT='80' must be a port in"),
    (["{script}", "2", "8118", "logs", "maybe"], "JOIN='maybe' must be True or False"),
    (["{script}", "1", "2", "3", "4", "5", "6"], "give at most 5 (single node) or exactly 8"),
    (["{script}", "2", "4", "127.0.0.1", "8118", "0", "logs", "False", "60"], "LOCAL_WORKER='4' must be"),
])
def test_bad_arguments(tmp_path, args, message):
    script = tmp_path / "job.py"
    script.write_text("print('never runs')\n")
    res = _launch([a.format(script=script) for a in args], timeout=30)
    assert res.returncode == 2
    assert message in res.stderr
