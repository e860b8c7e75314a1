"""Distributed checkpoints: per-rank safetensors shards saved atomically, loaded into any layout.

See docs/checkpoint.md. ``save_checkpoint`` on every rank; ``load_checkpoint`` on any rank of any
world size (or one process) with the target layouts; ``merge_to_single_file`` /
``shard_single_file`` convert to and from one file of full tensors.
"""
from .async_save import AsyncSaver
from .convert import load_single_file, merge_to_single_file, shard_single_file
from .errors import CheckpointError, Problem
from .format import (TRACKER, layout_from_dict, layout_to_dict, list_steps, read_tracker, remove_leftovers,
                     resolve_step)
from .load import (TrainingState, checkpoint_specs, load_checkpoint, load_optimizer_state,
                   load_training_state, newest_intact_step, open_checkpoint, verify_step)
from .reshard import TensorSpec
from .save import finalize_checkpoint, save_checkpoint, write_shards

__all__ = ["AsyncSaver", "CheckpointError", "Problem", "TRACKER", "TensorSpec", "TrainingState", "checkpoint_specs",
           "finalize_checkpoint", "layout_from_dict", "layout_to_dict", "list_steps", "load_checkpoint",
           "load_optimizer_state", "load_single_file", "load_training_state", "merge_to_single_file",
           "newest_intact_step", "open_checkpoint", "read_tracker", "remove_leftovers", "resolve_step",
           "save_checkpoint", "shard_single_file", "verify_step", "write_shards"]
