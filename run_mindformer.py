"""MindFormers-style entry point: ``python run_mindformer.py --config configs/llama_tiny.yaml``.

Flags as in MindFormers (``--run_mode``, ``--use_parallel``, ``--load_checkpoint``,
``--resume_training``, ``--auto_trans_ckpt``, ``--train_dataset_dir``, ``--output_dir``,
``--register_path``, ``--seed``, ``--mode``) plus dotted overrides of existing keys
(``--parallel_config.model_parallel 2``). Under msrun, start it with
``bash scripts/msrun_launcher.sh "run_mindformer.py --config X.yaml --use_parallel True" 4``.
The whole configuration is validated before any process group is created.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FLAGS = {  # flag -> config key
    "run_mode": "run_mode", "use_parallel": "use_parallel", "load_checkpoint": "load_checkpoint",
    "resume_training": "resume_training", "auto_trans_ckpt": "auto_trans_ckpt",
    "train_dataset_dir": "train_dataset.dataset_dir", "output_dir": "output_dir", "seed": "seed",
    "mode": "context.mode",
}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="YAML file")
    for flag in FLAGS:
        ap.add_argument(f"--{flag}", default=None)
    ap.add_argument("--register_path", default=None, help="directory added to sys.path (user models)")
    ap.add_argument("--predict_data", default="def main(", help="prompt for run_mode=predict")
    args, rest = ap.parse_known_args(argv)
    overrides = [(key, getattr(args, flag)) for flag, key in FLAGS.items() if getattr(args, flag) is not None]
    if len(rest) % 2:
        ap.error(f"overrides come in pairs '--a.b value'; got {rest}")
    for key, value in zip(rest[::2], rest[1::2]):
        if not key.startswith("--"):
            ap.error(f"expected '--key value', got {key!r}")
        overrides.append((key[2:], value))
    return args, overrides


def main(argv=None) -> int:
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    if args.register_path:
        sys.path.insert(0, os.path.abspath(args.register_path))
    from mindformers_core.training.config import ConfigError, load_config
    worker_num = int(os.environ.get("MS_WORKER_NUM", "1"))
    try:
        config = load_config(args.config, [f"{k}={v}" for k, v in overrides], worker_num=worker_num)
    except ConfigError as e:
        print(f"run_mindformer.py: invalid configuration:\n{e}", file=sys.stderr)
        return 2
    from mindformers_core.training.trainer import Trainer
    trainer = Trainer(config)
    if config.run_mode in ("train", "finetune"):
        trainer.train()
    elif config.run_mode == "predict":
        trainer.setup()
        if config.load_checkpoint:
            trainer.load(config.load_checkpoint, resume=False)
        print(trainer.predict(args.predict_data))
    else:
        print(f"run_mindformer.py: run_mode={config.run_mode!r}; valid: train, finetune, predict", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
