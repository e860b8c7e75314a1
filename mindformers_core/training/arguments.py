"""The command line's arguments: MindFormers' ``run_mindformer.py`` flags and their config keys, and
``parse`` (flags, ``--options`` pairs and ``--a.b value`` overrides). The command line (``cli``) and the
supervisor (which reads a job's restart settings from the same command line) both import it.
"""
from __future__ import annotations

import argparse
import os
from typing import List, Sequence, Tuple

# the --help description: the command line's (training/cli.py) first docstring line
DESCRIPTION = "The MindFormers-style command line: ``run_mindformer.py`` / ``python -m mindformers_core.run`` /"

FLAGS = {  # flag -> config key (graph-mode dialect)
    "run_mode": "run_mode", "use_parallel": "use_parallel", "load_checkpoint": "load_checkpoint",
    "resume_training": "resume_training", "auto_trans_ckpt": "auto_trans_ckpt",
    "train_dataset_dir": "train_dataset.dataset_dir", "output_dir": "output_dir", "seed": "seed",
    "mode": "context.mode", "device_target": "context.device_target", "do_eval": "do_eval",
    "eval_dataset_dir": "eval_dataset.dataset_dir", "epochs": "runner_config.epochs",
    "batch_size": "runner_config.batch_size", "gradient_accumulation_steps": "runner_config.gradient_accumulation_steps",
    "sink_mode": "runner_config.sink_mode", "pretrained_model_dir": "pretrained_model_dir",
}
# The same flags for a PyNative TrainConfig file; None: no such setting in that dialect (a named error).
PYNATIVE_FLAGS = {
    "train_dataset_dir": "train_dataset.dataloader.dataset_dir", "seed": "training.seed",
    "batch_size": "training.local_batch_size", "load_checkpoint": "checkpoint.load_path",
    "epochs": None, "gradient_accumulation_steps": None, "sink_mode": None, "do_eval": None,
    "eval_dataset_dir": "eval_dataset.dataset_dir",
}
# MindFormers' flags for Ascend, strategy files, remote storage, multi-modal and sampled inference:
# validated (type), then listed as not applied on CPU.
NOT_APPLIED_FLAGS = {
    "device_id": int, "src_strategy_path_or_dir": str, "transform_process_num": int, "only_save_strategy": "bool",
    "strategy_load_checkpoint": str, "remote_save_url": str, "profile": "bool", "num_samples": int,
    "trust_remote_code": "bool",
}
LIST_FLAGS = ("adapter_id", "modal_type")
# run_mode=predict: Hugging Face's generation keys as flags (ours; MindFormers reads them from the YAML)
GENERATION_FLAGS = (("temperature", float, "sampling temperature"), ("top_k", int, "keep the k likeliest tokens"),
                    ("top_p", float, "keep the likeliest tokens up to this probability mass, in (0, 1]"),
                    ("repetition_penalty", float, "HF repetition penalty (1.0: none)"),
                    ("min_new_tokens", int, "no EOS before this many new tokens"),
                    ("max_length", int, "prompt + new tokens (max_new_tokens wins)"))
PROG = "run_mindformer.py"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bool(text: str) -> bool:
    """MindFormers' str2bool: true/false in any case (also 1/0)."""
    low = str(text).lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (True or False)")


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def resolve_config_path(path: str) -> str:
    """A relative ``--config`` from the current directory, else from the repository (MindFormers
    resolves it against the directory of run_mindformer.py)."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    in_repo = os.path.join(REPO, path)
    return in_repo if os.path.exists(in_repo) else path


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[Tuple[str, str]]]:
    """``(flags, [(dotted key, value), ...])``: MindFormers' flags mapped to their config keys
    (graph-mode names; ``main`` renames them for a PyNative file), then ``--options`` pairs, then the
    ``--a.b value`` / ``--a.b=value`` overrides in the order given."""
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    ap.add_argument("--config", required=True, help="YAML file (either MindFormers dialect)")
    for flag in FLAGS:
        ap.add_argument(f"--{flag}", default=None)
    for flag, kind in NOT_APPLIED_FLAGS.items():
        ap.add_argument(f"--{flag}", default=None, type=_bool if kind == "bool" else
                        (_non_negative if flag == "device_id" else kind), help="accepted; not applied on CPU")
    for flag in LIST_FLAGS:
        ap.add_argument(f"--{flag}", default=None, nargs="+", help="accepted; not applied on CPU")
    ap.add_argument("--register_path", default=None,
                    help="directory of user model code; its models register with @register_model")
    ap.add_argument("--options", default=None, nargs="+", metavar="KEY=VALUE",
                    help="overrides merged into the config, as MindFormers' --options a.b=v c.d=w")
    ap.add_argument("--predict_data", default=None, nargs="+",
                    help="prompt(s) for run_mode=predict, or one file: a prompt a line, or JSONL ('prompt' or chat "
                         "'messages')")
    ap.add_argument("--max_new_tokens", default=None, type=int,
                    help="tokens generated in run_mode=predict (default: generation_config.json / YAML, else 32)")
    ap.add_argument("--predict_batch_size", default=None, type=int,
                    help="prompts generated together in run_mode=predict (left-padded batch; default 1)")
    ap.add_argument("--do_sample", default=None, type=_bool,
                    help="run_mode=predict: sample (temperature/top_k/top_p from generation_config.json or the flags "
                         "below) instead of greedy decoding")
    for flag, kind, text in GENERATION_FLAGS:
        ap.add_argument(f"--{flag}", default=None, type=kind, help=f"run_mode=predict: {text} (overrides "
                        "generation_config.json)")
    ap.add_argument("--max_restarts", default=None, type=_non_negative,
                    help="run under a supervisor that restarts a failed job from its latest checkpoint up to N times "
                         "(default: runner_config.max_restarts)")
    ap.add_argument("--heartbeat_timeout", default=None, type=float,
                    help="with --max_restarts: seconds without a finished step before the job counts as stalled "
                         "(default: runner_config.heartbeat_timeout)")
    ap.add_argument("--export_hf_dir", default=None,
                    help="after training, write the model as a Hugging Face folder here (must not exist)")
    ap.add_argument("--export_mf_dir", default=None,
                    help="after training, write the model as a MindFormers checkpoint here (its unified folder: "
                         "part*.safetensors + param_name_map.json; must not exist)")
    ap.add_argument("--check_config", action="store_true",
                    help="print the resolved config and the parallel plan, then exit 0 (valid) or 2")
    ap.add_argument("--worker_num", default=None, type=int,
                    help="with --check_config: the worker count to check for (default MS_WORKER_NUM or 1)")
    args, rest = ap.parse_known_args(list(argv))
    overrides = [(key, getattr(args, flag)) for flag, key in FLAGS.items() if getattr(args, flag) is not None]
    for item in args.options or []:
        if "=" not in item:
            ap.error(f"--options takes key=value pairs; got {item!r}")
        key, value = item.split("=", 1)
        overrides.append((key.lstrip("-"), value))
    tokens: List[str] = []
    for item in rest:               # --a.b=v is --a.b v (MindFormers splits on '=')
        tokens += item.split("=", 1) if item.startswith("--") and "=" in item else [item]
    if len(tokens) % 2:
        ap.error(f"overrides come in pairs '--a.b value' or '--a.b=value'; got {rest}")
    for key, value in zip(tokens[::2], tokens[1::2]):
        if not key.startswith("--"):
            ap.error(f"expected '--key value', got {key!r}")
        overrides.append((key[2:], value))
    return args, overrides
