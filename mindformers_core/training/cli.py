"""The MindFormers-style command line: ``run_mindformer.py`` / ``python -m mindformers_core.run`` /
``mindformers-run``.

Every flag of MindFormers' ``run_mindformer.py`` is accepted: those with a meaning here are applied
(``--config``, ``--run_mode`` train/finetune/eval/predict, ``--use_parallel``, ``--load_checkpoint``,
``--resume_training``, ``--auto_trans_ckpt``, ``--train_dataset_dir``, ``--eval_dataset_dir``,
``--do_eval``, ``--output_dir``, ``--register_path``, ``--seed``, ``--mode``, ``--device_target``,
``--epochs``, ``--batch_size``, ``--gradient_accumulation_steps``, ``--sink_mode``, ``--options a.b=v
...``, ``--predict_data`` with one or several prompts), the Ascend/graph-mode ones are validated and
listed as not applied (``--device_id``, ``--src_strategy_path_or_dir``, ``--profile``, ...). Dotted
overrides ``--a.b value`` or ``--a.b=value`` set keys in the file's own dialect. Ours:
``--max_new_tokens`` (predict), ``--check_config`` (print the resolved config and the parallel plan,
exit 0 or 2, nothing trained) and ``--worker_num`` (the worker count ``--check_config`` checks for).
A relative ``--config`` is looked up in the current directory, then in the repository (MindFormers:
the repository). The whole configuration is validated before any process group is created; a bad one
exits with code 2 and one line per problem. See docs/quickstart.md. The flags and ``parse`` live in
``arguments.py`` (the supervisor reads them too).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

from ..common.graphs import PYNATIVE_SYNC_ENV
from .arguments import FLAGS, GENERATION_FLAGS, LIST_FLAGS, NOT_APPLIED_FLAGS, PROG, PYNATIVE_FLAGS, parse, resolve_config_path


def _dialect_overrides(args: argparse.Namespace, overrides: List[Tuple[str, str]], raw: dict):
    """The flags' keys in the file's dialect (``--train_dataset_dir`` is ``data_loader.dataset_dir``
    in a graph-mode file that has a data_loader, ``dataloader.dataset_dir`` in a PyNative one)."""
    from .config import ConfigError
    from .dialects import PYNATIVE, detect
    dialect = detect(raw)
    by_key = {key: flag for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    out, errors = [], []
    for i, (key, value) in enumerate(overrides):
        flag = by_key.get(key) if i < len(by_key) else None
        if flag and dialect == PYNATIVE and flag in PYNATIVE_FLAGS:
            if PYNATIVE_FLAGS[flag] is None:
                errors.append(f"--{flag} {value}: the PyNative TrainConfig has no such setting"
                              + ("; use --training.steps" if flag == "epochs" else
                                 "; set training.global_batch_size" if flag == "gradient_accumulation_steps" else ""))
                continue
            key = PYNATIVE_FLAGS[flag]
        elif flag == "train_dataset_dir" and isinstance((raw.get("train_dataset") or {}).get("data_loader"), dict):
            key = "train_dataset.data_loader.dataset_dir"
        elif flag == "eval_dataset_dir" and isinstance((raw.get("eval_dataset") or {}).get("data_loader"), dict):
            key = "eval_dataset.data_loader.dataset_dir"
        out.append((key, value))
    if errors:
        raise ConfigError(errors, "command line")
    return out


def _flags_not_applied(args: argparse.Namespace) -> List[Tuple[str, str]]:
    from .mindformers_keys import ASCEND, GRAPH_PARALLEL, INFERENCE, MISC, PROFILER
    why = {"device_id": ASCEND, "profile": PROFILER, "remote_save_url": MISC, "trust_remote_code": MISC,
           "num_samples": MISC, "adapter_id": INFERENCE,
           "modal_type": INFERENCE}
    return [(f"--{flag}", why.get(flag, GRAPH_PARALLEL)) for flag in (*NOT_APPLIED_FLAGS, *LIST_FLAGS)
            if getattr(args, flag) is not None]


def print_plan(config, worker_num: int, out=None) -> None:
    """The resolved config (schema keys, YAML) and the parallel plan: sizes, rank order, each rank's
    coordinates, pipeline stages and their layers."""
    import yaml
    from .shape import JobShape
    from .topology import Topology
    out = out or sys.stdout
    report = getattr(config, "report", None)
    print(f"# resolved config ({report.dialect if report else 'graph'} dialect read into the schema's keys)",
          file=out)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None).rstrip(), file=out)
    shape = JobShape.from_config(config)
    mc = config.model.model_config
    print(f"# parallel plan: {shape.workers} worker(s) = dp {shape.dp} x tp {shape.tp} x cp {shape.cp} x "
          f"pp {shape.pp}, rank order {shape.rank_order}", file=out)
    if shape.cp > 1:
        print(f"  context parallel {shape.cp}: the sequence of {mc.seq_length} split in {shape.cp}", file=out)
        return
    try:
        topo = [Topology(r, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler, order=shape.rank_order)
                for r in range(shape.pp * shape.dp * shape.tp)]
    except ValueError as e:
        print(f"  (no plan: {e})", file=out)
        return
    split = config.parallel.pipeline_config.layers_per_stage
    ranges = None
    if shape.pp > 1:
        try:
            ranges = topo[0].layer_ranges(int(mc.num_layers), split) if isinstance(split, list) else None
        except (TypeError, ValueError):
            ranges = None
        print(f"  pipeline: {shape.scheduler}, {topo[0].stage_num} stages, {shape.micro_batch_num} micro-batches; "
              f"layers per stage: {[len(r) for r in ranges] if ranges else split or 'uniform/offset'}", file=out)
    batch = int(config.runner_config.batch_size) * shape.micro_batch_num * shape.accumulate
    print(f"  global batch {batch * shape.dp} = batch_size {config.runner_config.batch_size} x micro-batches "
          f"{shape.micro_batch_num} x accumulation {shape.accumulate} x dp {shape.dp}; seq_length {mc.seq_length}",
          file=out)
    for t in topo[:64]:
        print(f"  {t.describe()}", file=out)
    if len(topo) > 64:
        print(f"  ... {len(topo) - 64} more ranks", file=out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the job; returns the exit code (2 = invalid configuration, printed to stderr).

    As a program (``argv`` None, or an entry point that blocked SIGINT/SIGTERM before importing
    MindSpore) Ctrl-C goes through ``signals.SignalRelay``: exit 130 and the message in PyNative and
    jit alike, although MindSpore turns SIGINT into SIGTERM while a graph or its op queue runs."""
    from .signals import SignalRelay, blocked_here
    relay = SignalRelay(PROG).start() if argv is None or blocked_here() else None
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parse(argv)
    from .config import ConfigError, read_yaml, validate
    worker_num = int(args.worker_num or os.environ.get("MS_WORKER_NUM", "1"))
    rank0 = os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")) in ("0", "")
    try:
        if args.register_path:
            from ..models import import_register_path
            try:
                import_register_path(args.register_path)
            except ValueError as e:
                raise ConfigError([str(e)]) from None
        path = resolve_config_path(args.config)
        raw = read_yaml(path)
        problems = []
        if args.modal_type and any(str(m).lower() != "text" for m in args.modal_type):
            problems.append(f"--modal_type {' '.join(args.modal_type)}: only text prompts are supported here")
        if args.worker_num is not None and not args.check_config:
            problems.append(f"--worker_num {args.worker_num}: only with --check_config (a run takes the worker "
                            "count from msrun)")
        if problems:
            raise ConfigError(problems, "command line")
        config = validate(raw, [f"{k}={v}" for k, v in _dialect_overrides(args, overrides, raw)],
                          worker_num=worker_num, source=path)
        config.report.not_applied += _flags_not_applied(args)
        if args.check_config:
            return check(config, path, worker_num)
        runner = config.get("runner_config") or {}
        if args.max_restarts is None:
            args.max_restarts = int(runner.get("max_restarts", 0) or 0)
        if args.heartbeat_timeout is None:
            args.heartbeat_timeout = float(runner.get("heartbeat_timeout", 600.0))
        if args.max_restarts and not os.environ.get("MFC_SUPERVISED"):
            if relay is not None:       # the supervisor handles its signals itself; its child relays its own
                relay.stop(unblock=True)
            return _supervised(argv, args, config, worker_num)
        if rank0:
            for line in config.report.summary(os.path.basename(path)):
                print(line, flush=True)
        threads = cpu_threads(config, worker_num)    # before any kernel runs (and any process group)
        if threads is not None and rank0:
            print(f"{PROG}: {threads.describe()}", flush=True)
        sync, sync_source = pynative_sync(config)
        if rank0:
            print(f"{PROG}: eager ops {'synchronous' if sync else 'through the dispatch queue'} ({sync_source})",
                  flush=True)
        from .trainer import Trainer
        if config.run_mode == "eval" and "overwrite_output_dir" in config:
            config["overwrite_output_dir"] = True          # eval writes no loss log or checkpoint
        if args.export_hf_dir:
            _check_export(config, args.export_hf_dir)
        if args.export_mf_dir:
            _check_export_mf(config, args.export_mf_dir)
        try:
            trainer = Trainer(config, worker_num=worker_num)  # the trainer's checks: still no process group
        except ConfigError as e:                             # named as the file writes the keys
            raise ConfigError([config.report.rename(x) for x in e.errors], path) from None
        if config.run_mode in ("train", "finetune"):
            trainer.train()
            if args.export_hf_dir:
                trainer.export_hf(args.export_hf_dir)
            if args.export_mf_dir:
                trainer.export_mf(args.export_mf_dir)
        elif config.run_mode == "eval":
            trainer.setup()
            if trainer.restore() == 0 and not config.load_checkpoint:
                print(f"{PROG}: evaluating randomly initialised weights (no load_checkpoint)", file=sys.stderr)
            loss = trainer.evaluate()
            trainer.log(f"eval_loss {loss:.4f} ({config.eval_dataset.eval_steps} batches of "
                        f"{config.eval_dataset.dataset_dir})")
        else:                                                # predict
            flags = {"max_new_tokens": args.max_new_tokens, "do_sample": args.do_sample,
                     **{flag: getattr(args, flag) for flag, _, _ in GENERATION_FLAGS}}
            batch = 1 if args.predict_batch_size is None else args.predict_batch_size
            trainer.check_predict(args.predict_data, batch, flags)      # before the process group
            trainer.setup()
            if trainer.restore() == 0 and not config.load_checkpoint:
                print(f"{PROG}: predicting from randomly initialised weights (no load_checkpoint)", file=sys.stderr)
            trainer.predict_all(args.predict_data, batch, flags)
    except ConfigError as e:
        print(f"{PROG}: invalid configuration:\n{e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (SIGINT); checkpoints already published are complete, resume with "
              "--resume_training True", file=sys.stderr, flush=True)
        return 130
    except Exception as e:      # noqa: BLE001 - one line for the known stop, the traceback for the rest
        from .trainer import TrainingError
        if not isinstance(e, TrainingError):
            raise
        print(f"{PROG}: training stopped: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def finish(code: int) -> None:
    """End the command-line process with ``code``; an msrun worker skips the interpreter's teardown.

    Why: under MindSpore 2.10 on CPU a tp2 worker of the test suite twice died with SIGSEGV (-11) after its run had
    finished, its checkpoint was committed and rank 0 had written the loss curve (2 of 5 full suite runs, 2026-11-26,
    both with 10+ processes on the 2 cores); msrun then reported the job as failed. A worker here flushes its output,
    runs Python's exit handlers (MindSpore's and ours, e.g. the host sum's shared memory) and ends with
    ``os._exit(code)``: the scheduler still logs each worker's unregistration and msrun exits 0 (2-rank tp2 run of
    configs/llama_tiny.yaml, 15 s either way). ``MFC_WORKER_TEARDOWN=1`` keeps the full teardown; the scheduler
    process and a process outside msrun always keep it."""
    if os.environ.get("MS_ROLE") != "MS_WORKER" or os.environ.get("MFC_WORKER_TEARDOWN", "0") == "1":
        sys.exit(code)
    import atexit
    import logging
    atexit._run_exitfuncs()     # (they may print: the flush comes after)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_export(config, out: str) -> None:
    """``--export_hf_dir``: refused before training when it cannot work (no name table, folder exists)."""
    from ..models import get_model_spec
    from .config import ConfigError
    problems = []
    if config.run_mode not in ("train", "finetune"):
        problems.append(f"--export_hf_dir {out!r}: exports after training; run_mode is {config.run_mode!r}")
    if get_model_spec(config.model.arch.type).state_dict_adapter is None:
        problems.append(f"--export_hf_dir {out!r}: model.arch.type = {config.model.arch.type!r} has no Hugging Face "
                        "name table")
    if os.path.exists(out):
        problems.append(f"--export_hf_dir {out!r}: exists; give a new folder")
    if problems:
        raise ConfigError(problems)


def _check_export_mf(config, out: str) -> None:
    """``--export_mf_dir``: refused before training when it cannot work (the family has no MindFormers names, the
    folder exists)."""
    from .config import ConfigError
    from .export_mf import mindformers_table
    problems = []
    if config.run_mode not in ("train", "finetune"):
        problems.append(f"--export_mf_dir {out!r}: exports after training; run_mode is {config.run_mode!r}")
    else:
        try:
            mindformers_table(config)
        except (ConfigError, ValueError) as e:
            problems.append(f"--export_mf_dir {out!r}: {e}")
    if os.path.exists(out):
        problems.append(f"--export_mf_dir {out!r}: exists; give a new folder")
    if problems:
        raise ConfigError(problems)


CPU_THREADS_ENV = "MFC_CPU_THREADS"


class CpuThreads:
    """MindSpore CPU kernel threads of this worker: ``value`` and where it came from."""

    def __init__(self, value: int, source: str, applied: bool):
        self.value, self.source, self.applied = value, source, applied

    def describe(self) -> str:
        if not self.applied:
            return (f"CPU kernel threads already set in this process; {self.source} = {self.value} not applied "
                    "(MindSpore sets them once per process)")
        return f"CPU kernel threads per worker: {self.value} ({self.source})"


def cpu_threads_setting(config, worker_num: int, environ=None, cores: Optional[int] = None) -> Tuple[int, str]:
    """``(threads, source)`` for MindSpore's CPU kernel thread pool of each worker, checked:
    ``MFC_CPU_THREADS`` (environment) wins over ``context.cpu_threads`` (YAML); neither set (null):
    ``max(1, cores // local workers)``, the cores this process may run on shared by the workers on
    this host (``MS_WORKER_NUM``: msrun's workers are taken to share one host; on several hosts set
    the key). Raises ConfigError naming the key and the value."""
    from .config import ConfigError
    environ = os.environ if environ is None else environ
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    text = environ.get(CPU_THREADS_ENV)
    if text not in (None, ""):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1 or str(value) != text.strip():
            raise ConfigError([f"{CPU_THREADS_ENV}={text!r} (environment): must be a positive integer (CPU kernel "
                               f"threads per worker; unset: cores // local workers = {max(1, cores // worker_num)})"])
        return value, f"{CPU_THREADS_ENV}"
    context = config.get("context") or {}
    value = context.get("cpu_threads")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError([f"context.cpu_threads = {value!r}: must be a positive integer or null "
                               f"(null: cores // local workers = {max(1, cores // worker_num)})"])
        return value, "context.cpu_threads"
    return max(1, cores // max(1, worker_num)), f"{cores} cores // {worker_num} local worker(s)"


def cpu_threads(config, worker_num: int) -> Optional[CpuThreads]:
    """Applies :func:`cpu_threads_setting` on CPU (``mindspore.device_context.cpu.op_tuning.threads_num``;
    MindSpore's default is 25 per process, capped by the cores, whatever the number of processes on
    the host). None on other devices. A process that already set it (an embedding program, a second
    trainer in one process) keeps its value: MindSpore refuses to set it twice."""
    import mindspore as ms
    from ..distributed.env import requested_device_target
    value, source = cpu_threads_setting(config, worker_num)
    target = requested_device_target((config.get("context") or {}).get("device_target"))
    if str(target).upper() != "CPU":
        return None
    from mindspore._c_expression import RuntimeConf
    if RuntimeConf.get_instance().is_op_threads_num_configured():
        return CpuThreads(value, source, applied=False)
    ms.device_context.cpu.op_tuning.threads_num(value)
    return CpuThreads(value, source, applied=True)


def pynative_sync_setting(config, environ=None) -> Tuple[bool, str]:
    """``(synchronous, source)``: whether eager (PyNative) ops run in the calling thread instead of
    MindSpore's dispatch queue. ``MFC_PYNATIVE_SYNC`` (``0``/``1``, environment) wins over
    ``context.pynative_synchronize`` (YAML); neither set (null): on for CPU, off elsewhere.

    Why on by default on CPU: the queue's threads wait by spinning (``AsyncRQueue::Wait``), and on a
    few shared cores the spinning takes the time the kernels need (perf, 4 ranks on 2 cores: 48% of all
    CPU there). Measured with bench/trainer.py, PyNative, 2 cores: one process 1.45 -> 0.77 s/step,
    dp2 1.69x -> 1.13x, tp2 1.94x -> 1.15x, pp2 3.38x -> 1.44x of one process. The same kernels run
    in the same order, so the numbers are the same (losses bitwise equal). Raises ConfigError naming
    the key and the value."""
    from .config import ConfigError
    environ = os.environ if environ is None else environ
    text = environ.get(PYNATIVE_SYNC_ENV)
    if text not in (None, ""):
        if text.strip() not in ("0", "1"):
            raise ConfigError([f"{PYNATIVE_SYNC_ENV}={text!r} (environment): must be 0 (MindSpore's dispatch "
                               "queue) or 1 (eager ops run in the calling thread)"])
        return text.strip() == "1", PYNATIVE_SYNC_ENV
    context = config.get("context") or {}
    value = context.get("pynative_synchronize")
    if value is not None:
        if not isinstance(value, bool):
            raise ConfigError([f"context.pynative_synchronize = {value!r}: must be true, false or null "
                               "(null: true on CPU)"])
        return value, "context.pynative_synchronize"
    from ..distributed.env import requested_device_target
    target = str(requested_device_target(context.get("device_target"))).upper()
    return target == "CPU", f"default on {target}"


def pynative_sync(config) -> Tuple[bool, str]:
    """Applies :func:`pynative_sync_setting` (``mindspore.set_context(pynative_synchronize=...)``)."""
    import mindspore as ms
    value, source = pynative_sync_setting(config)
    ms.set_context(pynative_synchronize=value)
    return value, source


def _without(argv: List[str], flags: Sequence[str]) -> List[str]:
    """``argv`` less the given ``--flag value`` / ``--flag=value`` pairs."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in flags:
            skip = True
        elif not any(item.startswith(f + "=") for f in flags):
            out.append(item)
    return out


def _supervised(argv: List[str], args, config, worker_num: int) -> int:
    """``--max_restarts``: this command line as a child process under the supervisor (heartbeats,
    restarts from the latest checkpoint); see docs/fault_tolerance.md."""
    from .config import ConfigError
    from .supervisor import supervise
    if worker_num > 1:
        raise ConfigError([f"--max_restarts / runner_config.max_restarts = {args.max_restarts} on {worker_num} "
                           "msrun workers started without the supervisor: run the job with scripts/msrun_launcher.sh "
                           "(it supervises msrun and reads runner_config.max_restarts, or MAX_RESTARTS=N) — the "
                           "supervisor must stand outside msrun"], "command line")
    if args.heartbeat_timeout <= 0:
        raise ConfigError([f"--heartbeat_timeout {args.heartbeat_timeout}: must be > 0 seconds"], "command line")
    child = [sys.executable, "-m", "mindformers_core.run", *_without(argv, ("--max_restarts", "--heartbeat_timeout"))]
    return supervise(child, os.path.abspath(config.output_dir), 1, args.max_restarts, args.heartbeat_timeout,
                     log=lambda text: print(text, file=sys.stderr, flush=True))


def check(config, path: str, worker_num: int) -> int:
    """``--check_config``: the trainer's own checks (files, tokenizer, schedule; no process group),
    then the resolved config, the parallel plan and the keys not applied; 0 when valid, else 2."""
    from .config import ConfigError
    from .preflight import preflight
    from .shape import JobShape
    try:
        preflight(config, JobShape.from_config(config), worker_num, os.path.abspath(config.output_dir))
        threads, source = cpu_threads_setting(config, worker_num)
    except ConfigError as e:
        raise ConfigError([config.report.rename(x) for x in e.errors], path) from None
    print_plan(config, worker_num)
    print(f"  CPU kernel threads per worker: {threads} ({source})")
    for line in config.report.summary(os.path.basename(path)):
        print(line)
    print(f"{PROG}: {path} is valid for {worker_num} worker(s)", flush=True)
    return 0
