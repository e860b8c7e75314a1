"""The project's optimizer: AdamW (shardable states), lr schedules, global-norm clipping, the bad-step guard,
and ``GradientUpdate``: reduce -> clip -> guard -> update, the order of every training step."""
from .adamw import AdamW, Optimizer, default_decay_filter
from .clip import ClipGradNorm, GlobalNorm, clip_grad_norm, global_norm, replication_weights
from .guard import StepGuard
from .lr_schedule import (SCHEDULES, ConstantWarmUpLR, CosineWithWarmUpLR, LearningRateSchedule,
                          LinearWithWarmUpLR, as_schedule, build_lr_schedule)
from .update import GradientUpdate

__all__ = ["AdamW", "ClipGradNorm", "ConstantWarmUpLR", "CosineWithWarmUpLR", "GlobalNorm", "GradientUpdate",
           "LearningRateSchedule", "LinearWithWarmUpLR", "Optimizer", "SCHEDULES", "StepGuard",
           "as_schedule", "build_lr_schedule", "clip_grad_norm", "default_decay_filter", "global_norm",
           "replication_weights"]
