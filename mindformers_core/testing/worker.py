"""msrun worker entry: ``worker.py module:function out_dir kwargs_json``.

Initializes distributed MindSpore, calls the function, and pickles its return value to
``out_dir/rank_<rank>.pkl`` (written atomically).
"""
import importlib
import json
import os
import pickle
import sys
import traceback

from mindformers_core.testing.jit_guard import install_guard


def main(argv):
    target, out_dir, kwargs = argv[1], argv[2], json.loads(argv[3])
    import mindspore as ms
    threads = os.environ.get("MFC_CPU_THREADS")
    if threads:   # several workers share few cores: cap each one's kernel thread pool
        ms.device_context.cpu.op_tuning.threads_num(int(threads))
    # eager ops as the trainer runs them (synchronous on CPU unless MFC_PYNATIVE_SYNC=0): the dispatch queue's
    # spinning waits took the cores the other ranks need (perf, 4 ranks on 2 cores: 48% of all CPU; ring cp4
    # PyNative steps 8.0 s + 6.6 s -> 1.3 s + 0.5 s); see training.cli.pynative_sync_setting
    from mindformers_core.training.cli import pynative_sync
    pynative_sync({})
    from mindformers_core.distributed import init_distributed
    env = init_distributed()
    # a worker's bodies often start with eager ops, and until a process launches its first graph MindSpore's
    # idle actor threads spin (training.steps.relax_actor_threads), on the cores the other ranks need
    from mindformers_core.training.steps import relax_actor_threads
    relax_actor_threads()

    # code that must end the process itself (e.g. the pipeline watchdog) reports here too
    os.environ["MFC_ERROR_FILE"] = os.path.join(out_dir, f"rank_{env.rank}.error")
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    guard = install_guard()
    try:
        result = func(**kwargs)
        if guard.seen:
            raise RuntimeError(guard.report())
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        sys.stdout.flush()
        sys.stderr.flush()
        # tell the parent at once: msrun itself notices a dead worker only after ~30 s
        with open(os.path.join(out_dir, f"rank_{env.rank}.error"), "w") as f:
            f.write(text)
        os._exit(1)  # do not wait in collective teardown while peers may be blocked
    tmp = os.path.join(out_dir, f".rank_{env.rank}.pkl.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(out_dir, f"rank_{env.rank}.pkl"))


if __name__ == "__main__":
    main(sys.argv)
