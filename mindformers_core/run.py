"""``python -m mindformers_core.run --config X.yaml``: the trainer's command line from an installed
package (the same as the repository's ``run_mindformer.py`` and the ``mindformers-run`` script)."""
import signal
import sys

if __name__ == "__main__":      # before MindSpore starts a thread: Ctrl-C through training/signals.py
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))

from .training.cli import main  # noqa: E402  (after the mask)

if __name__ == "__main__":
    sys.exit(main())
