"""``python -m mindformers_core.run --config X.yaml`` and the ``mindformers-run`` script: the trainer's
command line from an installed package (the same as the repository's ``run_mindformer.py``).

``main`` blocks SIGINT and SIGTERM before anything imports MindSpore, so that every thread MindSpore
starts inherits the mask and Ctrl-C reaches the trainer's relay (``training/signals.py``), not
MindSpore's own handler. That is why the console script points here and not at ``training.cli.main``
(whose module imports MindSpore)."""
import signal
import sys


def main(argv=None):
    """Program entry point: block the relayed signals, then run ``training.cli.main``. Meant for a
    process's main thread before MindSpore is imported; a library caller should call
    ``training.cli.main`` instead. As the program (``argv`` None) it ends the process itself: an msrun worker
    without the interpreter's teardown (``training.cli.finish``)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    from .training.cli import finish, main as cli_main
    code = cli_main(argv)
    if argv is None:
        finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
