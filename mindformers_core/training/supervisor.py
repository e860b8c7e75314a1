"""The job supervisor: launch a training job, watch its ranks, end it cleanly on a fault, restart it.

``run_mindformer.py --max_restarts N`` (one process) and ``MAX_RESTARTS=N bash
scripts/msrun_launcher.sh ...`` (msrun workers) run the job under :func:`supervise`. Every half
second it reads the ranks' heartbeats (``heartbeat.py``): a rank whose process is gone, stopped, or
silent for longer than ``heartbeat_timeout`` is a fault. On a fault, or when the job exits non-zero
after training started, every process of the job is killed, one line names the rank and what
happened, and the job is launched again with ``--resume_training True`` (the latest complete
checkpoint: weights, AdamW moments, data position, step and lr position), up to ``max_restarts``
times. A job that fails before its first step (bad configuration, import error) or that stopped on
purpose (too many bad steps) is not restarted. Ctrl-C ends the job and exits 130.

Exit codes: 0 done; 1 failed (restarts exhausted or not restartable); 2 invalid configuration
(one process); 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .heartbeat import clear_heartbeats, process_state, read_heartbeats

POLL_S = 0.5


@dataclass
class Outcome:
    code: int                  # the job's exit code (or ours when we ended it)
    fault: Optional[str]       # what we saw, None when the job ended by itself
    started: bool              # some rank reached its first step
    stopped_on_purpose: bool   # a rank reported a deliberate stop (e.g. too many skipped steps)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_job(proc: subprocess.Popen, pids: Sequence[int]) -> None:
    """SIGKILL the job's session (msrun, scheduler, workers) and any rank process left."""
    try:
        import psutil
        procs = []
        try:
            procs = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    except ImportError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


class _Exits:
    """The ranks' processes, each through a pidfd: the first exit wakes the wait at once, so the rank
    that died first is the one named (msrun kills the others right after)."""

    def __init__(self):
        self.fds: Dict[int, Tuple[int, int]] = {}     # pid -> (fd, rank)

    def track(self, rank: int, pid: int) -> None:
        if pid in self.fds or not hasattr(os, "pidfd_open"):
            return
        try:
            self.fds[pid] = (os.pidfd_open(pid), rank)
        except OSError:
            pass                                      # already gone: process_state reports it

    def wait(self, timeout: float) -> Optional[Tuple[int, int]]:
        """(rank, pid) of a process that exited within ``timeout`` seconds, else None."""
        if not self.fds:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([fd for fd, _ in self.fds.values()], [], [], timeout)
        for pid, (fd, rank) in self.fds.items():
            if fd in ready:
                return rank, pid
        return None

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()


def watch(proc: subprocess.Popen, output_dir: Optional[str], workers: int, heartbeat_timeout: float,
          startup_timeout: float, log=print) -> Outcome:
    """Wait for the job, ending it at the first fault its heartbeats show."""
    exits = _Exits()
    try:
        return _watch(proc, output_dir, workers, heartbeat_timeout, startup_timeout, log, exits)
    finally:
        exits.close()


def _watch(proc, output_dir, workers, heartbeat_timeout, startup_timeout, log, exits: _Exits) -> Outcome:
    launched = time.monotonic()
    started, fault, pids, beats = False, None, [], {}
    while proc.poll() is None:
        exited = exits.wait(POLL_S)
        beats = read_heartbeats(output_dir) if output_dir else {}
        started = started or bool(beats)
        pids = [b["pid"] for b in beats.values()]
        for rank, b in beats.items():
            exits.track(rank, int(b["pid"]))
        now = time.time()
        if exited is not None and beats.get(exited[0], {}).get("state") not in ("done", "stopped"):
            rank = exited[0]
            fault = f"rank {rank} died (process {exited[1]} exited) after step {beats[rank]['step']}"
        for rank in sorted(beats) if fault is None else ():
            b = beats[rank]
            if b.get("state") in ("done", "stopped"):
                continue
            state = process_state(int(b["pid"]))
            if state in (None, "zombie"):
                fault = f"rank {rank} died (process {b['pid']} is gone) after step {b['step']}"
            elif state == "stopped":
                fault = f"rank {rank} is stopped (process {b['pid']} in state T, e.g. SIGSTOP) at step {b['step']}"
            elif now - float(b["time"]) > heartbeat_timeout:
                silent = [r for r in sorted(beats) if now - float(beats[r]["time"]) > heartbeat_timeout
                          and beats[r].get("state") not in ("done", "stopped")]
                fault = (f"rank(s) {silent} made no progress for more than {heartbeat_timeout:g} s (last step "
                         f"{min(beats[r]['step'] for r in silent)}): stalled, e.g. a hang inside a collective")
            if fault:
                break
        if fault is None and output_dir and len(beats) < workers and time.monotonic() - launched > startup_timeout:
            missing = sorted(set(range(workers)) - set(beats))
            fault = f"rank(s) {missing} did not start training within {startup_timeout:g} s"
        if fault:
            log(f"supervisor: {fault}; ending the job")
            _kill_job(proc, pids)
            return Outcome(1, fault, started, False)
    beats = read_heartbeats(output_dir) if output_dir else {}
    purposeful = any(b.get("state") == "stopped" for b in beats.values())
    return Outcome(proc.returncode, None, started or bool(beats), purposeful)


def resume_flags(output_dir: Optional[str]) -> List[str]:
    """How a restarted job continues: from the latest checkpoint if one exists, else afresh."""
    from ..checkpoint import list_steps
    ckpt = os.path.join(output_dir, "checkpoint") if output_dir else None
    if ckpt and list_steps(ckpt):
        return ["--resume_training", "True"]
    return ["--overwrite_output_dir", "True"]


# MindSpore's C++ log lines ("[WARNING] DISTRIBUTED(1234,...):2026-... [file.cc:12] Fn] text"): msrun shows
# each worker's log on the console; they stay in <log_dir>/worker_<r>.log, the console keeps ours
_CPP_LOG = re.compile(r"^\[(WARNING|INFO|DEBUG)\] [A-Z_]+\(\d+,")


def _forward_quietly(stream) -> threading.Thread:
    """Copy the job's output to ours, less MindSpore's C++ WARNING/INFO lines (ERRORs pass)."""
    def pump():
        for line in stream:
            if not _CPP_LOG.match(line):
                sys.stdout.write(line)
                sys.stdout.flush()
    thread = threading.Thread(target=pump, name="job-output", daemon=True)
    thread.start()
    return thread


def supervise(command: Sequence[str], output_dir: Optional[str], workers: int = 1, max_restarts: int = 0,
              heartbeat_timeout: float = 600.0, startup_timeout: float = 1800.0, env=None, log=print,
              quiet: bool = False) -> int:
    """Run ``command`` (a function of the attempt number, or a fixed list) until it succeeds or the
    restarts run out; returns the exit code. ``output_dir``: where the ranks' heartbeats and
    checkpoints are (None: no heartbeats, no restarts). ``quiet``: MindSpore's C++ WARNING/INFO lines
    are kept off the console (they stay in msrun's per-worker logs); ``MFC_VERBOSE=1`` shows them."""
    build = command if callable(command) else (lambda attempt, extra: list(command) + extra)
    env = dict(os.environ if env is None else env, MFC_SUPERVISED="1")
    extra: List[str] = []
    for attempt in range(max_restarts + 1):
        if output_dir:
            clear_heartbeats(output_dir)
        cmd = build(attempt, extra)
        log(f"supervisor: attempt {attempt + 1} of {max_restarts + 1}: {' '.join(cmd)}")
        proc = subprocess.Popen(cmd, env=dict(env, MFC_ATTEMPT=str(attempt)), start_new_session=True,
                                stdout=subprocess.PIPE if quiet else None,
                                stderr=subprocess.STDOUT if quiet else None, text=quiet,
                                errors="replace" if quiet else None)
        forward = _forward_quietly(proc.stdout) if quiet else None
        try:
            outcome = watch(proc, output_dir, workers, heartbeat_timeout, startup_timeout, log)
        except KeyboardInterrupt:
            _kill_job(proc, [b["pid"] for b in (read_heartbeats(output_dir) if output_dir else {}).values()])
            if forward is not None:
                forward.join(timeout=5)
            log("supervisor: interrupted (SIGINT); the job was ended. Published checkpoints are complete: "
                "resume with --resume_training True")
            return 130
        if forward is not None:
            forward.join(timeout=30)
        if outcome.code == 0 and outcome.fault is None:
            return 0
        what = outcome.fault or f"the job exited with code {outcome.code}"
        if outcome.code in (2, 130) and outcome.fault is None and workers == 1:
            return outcome.code             # a bad configuration or Ctrl-C in the child: nothing to retry
        if not outcome.started:
            log(f"supervisor: {what} before any rank reached its first step; not restarting (see the logs)")
            return 1
        if outcome.stopped_on_purpose:
            log(f"supervisor: {what}: the run stopped itself (see its message); not restarting")
            return 1
        if attempt == max_restarts:
            log(f"supervisor: {what}; no restarts left ({max_restarts} allowed)")
            return 1
        extra = resume_flags(output_dir)
        log(f"supervisor: restart {attempt + 1} of {max_restarts} with {' '.join(extra)}")
    return 1


# ---- msrun jobs (scripts/msrun_launcher.sh with MAX_RESTARTS) -------------------------------------------
def job_settings(script_args: Sequence[str]) -> Tuple[str, int, float]:
    """A run_mindformer.py command line's (output_dir, restarts, heartbeat timeout): its validated
    config's ``runner_config.max_restarts`` / ``heartbeat_timeout``, or its flags when given."""
    from .arguments import parse
    from .config import load_config
    args, overrides = parse(script_args)
    cfg = load_config(args.config, [f"{k}={v}" for k, v in overrides], worker_num=int(os.environ.get(
        "MS_WORKER_NUM", "1")))
    runner = cfg.get("runner_config") or {}
    restarts = args.max_restarts if args.max_restarts is not None else int(runner.get("max_restarts", 0) or 0)
    timeout = (args.heartbeat_timeout if args.heartbeat_timeout is not None
               else float(runner.get("heartbeat_timeout", 600.0)))
    return os.path.abspath(cfg.output_dir), restarts, timeout


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mindformers_core.training.supervisor",
                                 description="Run an msrun job under the supervisor (restarts, heartbeats).")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--master_addr", default="127.0.0.1")
    ap.add_argument("--master_port", type=int, default=8118)
    ap.add_argument("--log_dir", default="output/msrun_log")
    ap.add_argument("--cluster_time_out", type=int, default=7200)
    ap.add_argument("--max_restarts", type=int, default=None,
                    help="default: the job's runner_config.max_restarts (0 for other scripts)")
    ap.add_argument("--heartbeat_timeout", type=float, default=None,
                    help="default: the job's runner_config.heartbeat_timeout (600 s for other scripts)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py and its arguments")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the script and its arguments after --")
    output_dir = None
    if os.path.basename(command[0]) == "run_mindformer.py":
        from .config import ConfigError
        try:
            os.environ.setdefault("MS_WORKER_NUM", str(a.workers))
            output_dir, restarts, timeout = job_settings(command[1:])
        except ConfigError as e:
            print(f"run_mindformer.py: invalid configuration:\n{e}", file=sys.stderr, flush=True)
            return 2
        a.max_restarts = restarts if a.max_restarts is None else a.max_restarts
        a.heartbeat_timeout = timeout if a.heartbeat_timeout is None else a.heartbeat_timeout
    a.max_restarts = 0 if a.max_restarts is None else a.max_restarts
    a.heartbeat_timeout = 600.0 if a.heartbeat_timeout is None else a.heartbeat_timeout
    if a.workers < 1 or a.max_restarts < 0 or a.heartbeat_timeout <= 0:
        ap.error(f"--workers={a.workers} must be >= 1, --max_restarts={a.max_restarts} >= 0, "
                 f"--heartbeat_timeout={a.heartbeat_timeout} > 0")
    if output_dir is None and a.max_restarts:
        ap.error(f"--max_restarts needs a run_mindformer.py job (its checkpoints are what it resumes from); "
                 f"got {command[0]!r}")
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")

    def build(attempt: int, extra: List[str]) -> List[str]:
        port = a.master_port if attempt == 0 else _free_port()   # the old port may still be held
        return [msrun if os.path.exists(msrun) else "msrun", f"--worker_num={a.workers}",
                f"--local_worker_num={a.workers}", f"--master_addr={a.master_addr}", f"--master_port={port}",
                "--node_rank=0", f"--log_dir={a.log_dir}", "--join=True", f"--cluster_time_out={a.cluster_time_out}",
                *command, *extra]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return supervise(build, output_dir, a.workers, a.max_restarts, a.heartbeat_timeout,
                     log=lambda s: print(s, flush=True), quiet=os.environ.get("MFC_VERBOSE", "0") in ("", "0"))


if __name__ == "__main__":
    sys.exit(main())
