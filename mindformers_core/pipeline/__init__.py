"""Pipeline parallelism, schedules as data: build, validate, simulate and draw exec orders.

Schedules, validator and simulator are pure Python; `runtime` executes orders with MindSpore.
See docs/pipeline.md.
"""
from .communication import add_communication
from .compute_order import compute_only, ideal_makespan, ideal_timeline, validate_compute_order
from .costs import StepCosts
from .errors import DeadlockError, ScheduleError
from .dualpipe import (dualpipe_compute_order, dualpipe_placement, dualpipe_routes, dualpipev_compute_order,
                       simulate_dualpipe, validate_dualpipe_order)
from .lowering import lower_for_runtime, split_overlapped
from .meta_step import MetaStep, MetaStepType
from .options import RuntimeOptions
from .microbatch import (MicrobatchConfig, ReplicateSpec, TensorChunkSpec, merge_microbatches,
                         split_microbatches)
from .planner import (LayerCost, LayerProfile, StagePlan, measure_layers, measure_stage_times,
                      plan_stages, report, stage_times_from_trace)
from .replay import StepTiming
from .schedule_base import PipelineScheduleBase, PipelineScheduleMulti, PipelineScheduleSingle
from .schedules import (BUILTIN_SCHEDULES, Schedule1F1B, ScheduleDualPipe, ScheduleDualPipeV, ScheduleGPipe,
                        ScheduleInterleaved1F1B, ScheduleZeroBubbleH1, ScheduleZeroBubbleV, build_schedule)
from .simulator import Timeline, simulate
from .stage import StageInfo, stages_of_rank
from .stage_split import split_model
from .svg import render_svg, save_svg
from .validator import validate_schedule
from .render import load_trace, render_text, save_trace, timeline_from_trace, to_chrome_trace, trace_to_dict

__all__ = ["BUILTIN_SCHEDULES", "build_schedule", "MicrobatchConfig", "ReplicateSpec", "TensorChunkSpec",
           "merge_microbatches", "split_microbatches",
           "split_model", "DeadlockError", "MetaStep", "MetaStepType", "PipelineScheduleBase", "PipelineScheduleMulti",
           "PipelineScheduleSingle", "Schedule1F1B", "ScheduleError", "ScheduleGPipe",
           "ScheduleInterleaved1F1B", "ScheduleZeroBubbleH1", "ScheduleZeroBubbleV", "StageInfo",
           "StepCosts", "StepTiming", "Timeline", "add_communication", "render_text", "simulate",
           "stages_of_rank", "to_chrome_trace", "validate_schedule",
           "LayerCost", "LayerProfile", "StagePlan", "measure_layers", "measure_stage_times",
           "plan_stages", "report", "stage_times_from_trace",
           "load_trace", "render_svg", "save_svg", "save_trace", "timeline_from_trace", "trace_to_dict",
           "ScheduleDualPipe", "ScheduleDualPipeV", "compute_only", "dualpipe_compute_order", "dualpipe_placement",
           "dualpipe_routes",
           "simulate_dualpipe", "validate_dualpipe_order", "dualpipev_compute_order", "ideal_makespan", "ideal_timeline",
           "lower_for_runtime", "split_overlapped", "validate_compute_order", "RuntimeOptions"]
