"""``python -m mindformers_core.run --config X.yaml``: the trainer's command line from an installed
package (the same as the repository's ``run_mindformer.py`` and the ``mindformers-run`` script)."""
import sys

from .training.cli import main

if __name__ == "__main__":
    sys.exit(main())
