"""The MindFormers-style command line: ``run_mindformer.py`` / ``python -m mindformers_core.run`` /
``mindformers-run``.

Flags as in MindFormers (``--config``, ``--run_mode``, ``--use_parallel``, ``--load_checkpoint``,
``--resume_training``, ``--auto_trans_ckpt``, ``--train_dataset_dir``, ``--output_dir``,
``--register_path``, ``--seed``, ``--mode``) plus dotted overrides of existing keys
(``--parallel_config.model_parallel 2``); ``--predict_data`` and ``--max_new_tokens`` for
``--run_mode predict``. The whole configuration (schema, cross-key rules, then the trainer's own
checks) is validated before any process group is created; a bad one exits with code 2 and one
line per problem. See docs/quickstart.md.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

FLAGS = {  # flag -> config key
    "run_mode": "run_mode", "use_parallel": "use_parallel", "load_checkpoint": "load_checkpoint",
    "resume_training": "resume_training", "auto_trans_ckpt": "auto_trans_ckpt",
    "train_dataset_dir": "train_dataset.dataset_dir", "output_dir": "output_dir", "seed": "seed",
    "mode": "context.mode",
}
PROG = "run_mindformer.py"


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[Tuple[str, str]]]:
    """``(flags, [(dotted key, value), ...])``: MindFormers' flags mapped to their config keys,
    followed by the ``--a.b value`` overrides in the order given."""
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="YAML file")
    for flag in FLAGS:
        ap.add_argument(f"--{flag}", default=None)
    ap.add_argument("--register_path", default=None,
                    help="directory of user model code; its models register with @register_model")
    ap.add_argument("--predict_data", default="Return the", help="prompt for run_mode=predict")
    ap.add_argument("--max_new_tokens", default=32, type=int, help="tokens generated in run_mode=predict")
    args, rest = ap.parse_known_args(list(argv))
    overrides = [(key, getattr(args, flag)) for flag, key in FLAGS.items() if getattr(args, flag) is not None]
    if len(rest) % 2:
        ap.error(f"overrides come in pairs '--a.b value'; got {rest}")
    for key, value in zip(rest[::2], rest[1::2]):
        if not key.startswith("--"):
            ap.error(f"expected '--key value', got {key!r}")
        overrides.append((key[2:], value))
    return args, overrides


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the job; returns the exit code (2 = invalid configuration, printed to stderr)."""
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    from .config import ConfigError, load_config
    worker_num = int(os.environ.get("MS_WORKER_NUM", "1"))
    try:
        if args.register_path:
            from ..models import import_register_path
            try:
                import_register_path(args.register_path)
            except ValueError as e:
                raise ConfigError([str(e)]) from None
        config = load_config(args.config, [f"{k}={v}" for k, v in overrides], worker_num=worker_num)
        from .trainer import Trainer
        trainer = Trainer(config, worker_num=worker_num)     # the trainer's checks: still no process group
        if config.run_mode in ("train", "finetune"):
            trainer.train()
        else:                                                # predict (the schema allows nothing else)
            trainer.setup()
            if trainer.restore() == 0 and not config.load_checkpoint:
                print(f"{PROG}: predicting from randomly initialised weights (no load_checkpoint)", file=sys.stderr)
            print(trainer.predict(args.predict_data, int(args.max_new_tokens)), flush=True)
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
