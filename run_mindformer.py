"""MindFormers-style entry point: ``python run_mindformer.py --config configs/llama_tiny.yaml``.

The command line lives in ``mindformers_core.training.cli`` (also ``python -m mindformers_core.run``
and the ``mindformers-run`` script of an installed package); see it for the flags. Under msrun,
start it with ``bash scripts/msrun_launcher.sh "run_mindformer.py --config X.yaml --use_parallel True" 4``.
"""
import os
import sys

if __name__ == "__main__":      # before MindSpore starts a thread: Ctrl-C through mindformers_core.training.signals
    import signal
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mindformers_core.training.cli import FLAGS, finish, main, parse  # noqa: E402  (after the path line)

__all__ = ["FLAGS", "main", "parse"]

if __name__ == "__main__":
    finish(main())      # an msrun worker ends without the interpreter's teardown (training.cli.finish)
