"""The MindFormers key table: every key of MindFormers' two YAML dialects that is not one of our schema's
own keys, and what happens to it here — read into a schema key (*applied*), accepted and listed once as
*not applied on CPU*, or refused with a named error (a feature not implemented). Keys in neither the
schema nor this table are typos: refused with the closest known key.

Source (read, not copied): the public MindFormers repository ``mindspore-ai/mindformers`` at commit
167a50dec750bf8ea0b03f1dabf2818c28747a5a (2026-07-24): ``mindformers/pynative/config/config.py``
(the PyNative ``TrainConfig`` dataclasses: ``training``, ``parallelism``, ``checkpoint``,
``lr_scheduler``, ``train_dataset.dataloader``, ``model``, ``monitor``, ``profiler``, ``recompute``,
``swap``), ``run_mindformer.py``, ``configs/`` and ``research/`` YAMLs (graph-mode dialect), and
``configs/llama2``/``configs/gpt2`` as they stood before their removal (commits 80b61f56, a025f9f3).
The files used as test data are listed in ``tests/data/mindformers_configs/README.md``.

Patterns are dotted paths; ``a.b.*`` means ``a.b`` and everything under it; ``callbacks.x`` is a key
of any callbacks entry. Model keys (``MODEL_*``) apply under ``model.model_config.`` (graph mode)
and ``model.`` (PyNative).
"""
from __future__ import annotations

from typing import Dict, Tuple

# ---------------------------------------------------------------------------------------------------
# Why a key is not applied: one short label per group, as the start-up summary prints them.
ASCEND = "Ascend/graph-mode context"
GRAPH_PARALLEL = "graph-mode parallel context and strategy files"
PROFILER = "profiling"
INFERENCE = "inference, generation and tokenizer ids"
KV_CACHE = "run_mode predict always decodes with a static KV cache (use_past; the same tokens either way)"
KERNELS = "fused kernels, weight layout and per-op precision"
WRAPPER = "loss scaling and the training wrapper"
LOADER = "dataset loader tuning"
MONITOR = "monitoring"
CHECKPOINT_IO = "checkpoint I/O tuning"
MISC = "other Ascend/MindFormers-only features"
REGULARISATION = "dropout and initialisation"
REMOTE_CODE = "remote code (a model folder is data: no Python file in it is ever imported)"
UNFUSED = "fused kernels: attention is computed unfused on CPU (the same result)"

# ---------------------------------------------------------------------------------------------------
# Model keys (HF / mcore / MindFormers model_config names). name -> schema key under model.model_config
MODEL_ALIASES: Dict[str, str] = {
    "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads", "num_key_value_heads": "n_kv_heads",
    "multi_query_group_num": "n_kv_heads", "intermediate_size": "ffn_hidden_size",
    "params_dtype": "param_init_dtype", "param_init_type": "param_init_dtype", "padded_vocab_size": "vocab_size",
    "theta": "rope_theta", "rotary_emb_base": "rope_theta", "layernorm_epsilon": "rms_norm_eps",
    "max_position_embedding": "max_position_embeddings", "qkv_has_bias": "add_qkv_bias",
    "attention_bias": "add_qkv_bias", "untie_embeddings_and_output_weights": "tie_word_embeddings",
    "use_qk_norm": "qk_layernorm", "kv_channels": "head_dim", "num_local_experts": "num_experts",
    # multi-token prediction (transformer/mtp.py): research/deepseek3 graph-mode, configs/deepseek3 and PyNative names
    "mtp_depth": "mtp_num_layers", "num_nextn_predict_layers": "mtp_num_layers",
    "mtp_loss_factor": "mtp_loss_scaling_factor",
}
NEGATED = {"untie_embeddings_and_output_weights"}      # value read as `not value`

# Mixture of experts (docs/moe.md). Qwen3-MoE / mcore model keys are schema keys of model.model_config
# (num_experts, num_experts_per_tok, moe_intermediate_size, ...); these are their other names:
MOE_ALIASES: Dict[str, str] = {"n_routed_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
                               "moe_ffn_hidden_size": "moe_intermediate_size", "router_aux_loss_coef": "moe_aux_loss_coeff"}
MODEL_ALIASES.update(MOE_ALIASES)
MOE_KERNEL_KEYS = ("router_dense_type", "moe_grouped_gemm", "use_fused_ops_topkrouter", "moe_token_dispatcher_type",
                   "moe_permute_fusion", "moe_router_dtype")
# name -> (values accepted, the error when another value is given); accepted values are listed as not applied
MODEL_CHECKED: Dict[str, Tuple[tuple, str]] = {
    "add_bias_linear": ((False, None), "biases on every linear layer are not implemented for this model (QKV bias "
                                       "is: add_qkv_bias / qkv_has_bias); set it to False"),
    "position_embedding_type": (("rope", None), "only 'rope' position embeddings are implemented"),
    "rotary_pct": ((1, 1.0, None), "partial rotary embeddings are not implemented; set it to 1.0"),
    "rotary_percent": ((1, 1.0, None), "partial rotary embeddings are not implemented; set it to 1.0"),
    "rope_ratio": ((1, 1.0, None), "scaled rotary bases (rope_ratio) are not implemented; set it to 1"),
    "rmsnorm": ((True, None), "only RMSNorm models are implemented for this family; set it to True"),
    "post_layer_norm": ((True, None), "a final norm is always applied; set it to True"),
    "apply_residual_connection_post_layernorm": ((False, None), "post-norm residuals are not implemented; "
                                                                "set it to False"),
    "extend_method": (("None", None), "long-context RoPE extension (PI/NTK) is not implemented; set it to 'None'"),
    "scaling_factor": ((1, 1.0, None), "RoPE scaling is not implemented; set it to 1.0"),
    "pre_seq_len": (("None", None, 0), "prefix tuning is not implemented; set it to None"),
    "quantization_bit": ((0, None), "quantized training is not implemented; set it to 0"),
}
# YaRN in MindFormers' flat spelling (PyNative / mcore: position_embedding_type 'yarn' and these keys) -> the keys of
# model.model_config.rope_scaling (config.json's); original_max_position_embeddings defaults to 4096 as in mcore's
# MLATransformerConfig and DeepSeek-V3 (dialects.py assembles the mapping)
YARN_FLAT: Dict[str, str] = {"rotary_scaling_factor": "factor", "original_max_position_embeddings":
                             "original_max_position_embeddings", "beta_fast": "beta_fast", "beta_slow": "beta_slow",
                             "mscale": "mscale", "mscale_all_dim": "mscale_all_dim"}
YARN_ORIGINAL_DEFAULT = 4096
# moe_router_pre_softmax: True = our router (softmax over every expert, then top-k); False (Megatron's softmax
# over the k chosen logits) = the same weights as renormalizing the top k: read as norm_topk_prob True
PRE_SOFTMAX = "moe_router_pre_softmax"
# model.arch.auto_register / model.model_config.auto_register: 'module.Class' of a research model (the module
# imported from --register_path, as MindFormers does; dialects.py)
AUTO_REGISTER = "auto_register"

MODEL_NOT_APPLIED: Dict[str, str] = dict(
    **{k: INFERENCE for k in ("batch_size", "use_past_shard", "checkpoint_name_or_path", "bos_token_id",
                              "ignore_token_id", "use_cache", "is_dynamic", "block_size", "num_blocks",
                              "use_pad_tokens")},
    # the generation keys (do_sample, top_k, top_p, ...) are schema keys of model.model_config (run_mode predict)
    **{"use_past": KV_CACHE},
    **{k: KERNELS for k in ("layernorm_compute_type", "layernorm_compute_dtype", "softmax_compute_type",
                            "softmax_compute_dtype", "rotary_dtype", "fp32_residual_connection",
                            "attention_softmax_in_fp32", "qkv_concat", "mlp_concat", "use_attn_mask_compression",
                            "use_eod_attn_mask_compression", "use_contiguous_weight_layout_attention",
                            "use_interleaved_weight_layout_mlp", "use_contiguous_weight_layout",
                            "input_sliced_sig", "apply_rope_fusion", "bias_swiglu_fusion", "bias_dropout_fusion",
                            "use_prompt_flash_attention", "fine_grain_interleave", "mla_qkv_concat",
                            "apply_query_key_layer_scaling", "gated_linear_unit", "multi_query_attention",
                            "init_method_std", "use_fused_rope", "use_fused_swiglu")},
    **{k: REGULARISATION for k in ("hidden_dropout", "attention_dropout", "emb_dropout_prob",
                                   "hidden_dropout_rate", "attention_dropout_rate", "initializer_range")},
    **{k: KERNELS for k in MOE_KERNEL_KEYS},
    **{"output_router_logits": INFERENCE},
    # the load-balancing loss is always part of the loss here (and logged apart in loss.jsonl)
    **{"return_extra_loss": MISC, "trust_remote_code": REMOTE_CODE},
    **{k: MISC for k in ("multiple_of", "expand_ratio", "prefix_projection", "model_type", "architectures")},
)

# DeepSeek-V3's graph-mode moe_config block: key -> model.model_config key (value transforms in dialects.py)
MOE_CONFIG_KEYS: Dict[str, str] = {
    "expert_num": "num_experts", "num_experts_chosen": "num_experts_per_tok", "shared_expert_num": "n_shared_experts",
    "moe_intermediate_size": "moe_intermediate_size", "routed_scaling_factor": "routed_scaling_factor",
    "first_k_dense_replace": "first_k_dense_replace", "use_gating_sigmoid": "scoring_func",
    "balance_via_topk_bias": "moe_router_enable_expert_bias", "topk_bias_update_rate": "moe_router_bias_update_rate",
    "norm_topk_prob": "norm_topk_prob", "n_group": "n_group", "topk_group": "topk_group",
    "aux_loss_factor": "moe_aux_loss_coeff", "aux_loss_factors": "moe_aux_loss_coeff",
}
# moe_config.aux_loss_factor beside aux_loss_factors under use_gmm: what MindFormers' MoEV3 does not read
MOE_V3_FACTOR = ("the older router's factor: MindFormers' grouped-matmul MoE (use_gmm) reads the 'expert' entry of "
                 "aux_loss_factors")
# moe_config keys accepted with one value only: name -> (values accepted, the error otherwise)
MOE_CONFIG_CHECKED: Dict[str, Tuple[tuple, str]] = {
    "use_shared_expert_gating": ((False, None), "a sigmoid gate on the shared experts is not implemented; set it "
                                                "to False"),
    "z_loss_factor": ((0, 0.0, None), "the router z-loss is not implemented; set it to 0"),
    "aux_loss_types": ((None, "expert"), "only the expert load-balancing loss ('expert') is implemented"),
    "topk_method": ((None, "greedy", "group_limited_greedy", "noaux_tc"),
                    "valid: greedy, group_limited_greedy (with n_group/topk_group), noaux_tc (with "
                    "balance_via_topk_bias)"),
    "expert_model_parallel": ((None, 1), "expert tensor parallelism (each expert split over model_parallel) is not "
                                         "implemented; set it to 1 or null"),
}
MOE_CONFIG_NOT_APPLIED: Dict[str, str] = {
    **{k: KERNELS for k in ("use_fused_ops_topkrouter", "router_dense_type", "use_gmm", "enable_gmm_safe_tokens",
                            "use_fused_ops_permute", "npu_nums_per_device", "enable_deredundency",
                            "use_allgather_dispatcher", "moe_shared_expert_overlap", "comp_comm_parallel",
                            "comp_comm_parallel_degree", "group_wise_a2a", "ep_extend_tp", "dispatch_global_max_bs")},
    **{k: MISC for k in ("routing_policy", "save_token_distribution", "cur_layer", "enable_cold_hot_expert",
                         "update_step", "hot_expert_num", "cold_token_percent", "moe_module_name", "enable_sdrop",
                         "max_router_load", "expert_group_size", "capacity_factor")},
    "callback_moe_droprate": MONITOR,
}

# Keys of MindFormers' data loaders (MindDataset, BlendedMegatronDatasetDataLoader, ...) other than
# type/dataset_dir/shuffle/config.data_path, which are read
LOADER_KEYS = ("config.*", "sizes", "datasets_type", "num_samples", "python_multiprocessing", "columns_list",
               "file_format", "phase", "path", "data_files", "tokenizer", "max_length", "split", "shuffle_seed")
# HFDataLoader's keys (fine-tuning data through the datasets library, data/hf_dataset.py): read as train_dataset.<key>
HF_LOADER_KEYS = ("load_func", "path", "data_files", "split", "handler", "create_attention_mask",
                  "create_compressed_eod_mask", "compressed_eod_mask_length", "use_broadcast_data")

# ---------------------------------------------------------------------------------------------------
# Graph-mode dialect: user path -> schema path (applied; value transforms in dialects.py)
GRAPH_ALIASES: Dict[str, str] = {
    "optimizer.beta1": "optimizer.betas", "optimizer.beta2": "optimizer.betas",
    "train_dataset.data_loader.type": "train_dataset.type",
    "train_dataset.data_loader.dataset_dir": "train_dataset.dataset_dir",
    "train_dataset.data_loader.shuffle": "train_dataset.shuffle",
    "train_dataset.data_loader.config.data_path": "train_dataset.data_path",
    **{f"train_dataset.data_loader.{k}": f"train_dataset.{k}" for k in HF_LOADER_KEYS},
    "eval_dataset.data_loader.type": "eval_dataset.type",
    "eval_dataset.data_loader.dataset_dir": "eval_dataset.dataset_dir",
    "processor.tokenizer.vocab_file": "train_dataset.tokenizer_file",
    "model.model_config.pp_interleave_num": "parallel.pipeline_config.pipeline_interleave",
    "parallel.parallel_optimizer_config.parallel_optimizer_threshold": "hsdp.threshold",
    "parallel.parallel_optimizer_config.optimizer_weight_shard_size": "hsdp.shard_size",
    "runner_wrapper.max_grad_norm": "runner_config.max_grad_norm",
}
# Graph-mode keys checked for a value (input_columns, do_eval, ... have their own code in dialects.py)
GRAPH_SPECIAL = ("train_dataset.input_columns", "eval_dataset.input_columns", "do_eval", "lr_schedule.power",
                 "moe_config.*", "runner_wrapper.use_clip_grad", "model.arch.auto_register",
                 "model.model_config.auto_register", "model.pretrained_model_dir")

GRAPH_NOT_APPLIED: Dict[str, str] = {
    **{f"context.{k}": ASCEND for k in (
        "device_target", "max_call_depth", "max_device_memory", "save_graphs", "save_graphs_path", "device_id", "jit_config.*",
        "memory_optimize_level", "mempool_block_size", "ascend_config.*", "runtime_num_threads",
        "enable_graph_kernel", "graph_kernel_flags", "affinity_cpu_list", "deterministic",
        "enable_compile_cache", "compile_cache_path", "variable_memory_max_size", "max_swap_device_memory")},
    **{f"parallel.{k}": GRAPH_PARALLEL for k in (
        "parallel_mode", "gradients_mean", "enable_alltoall", "full_batch", "search_mode", "strategy_ckpt_save_file",
        "strategy_ckpt_load_file", "strategy_ckpt_config.*", "dataset_strategy", "loss_repeated_mean",
        "parallel_optimizer_config.gradient_accumulation_shard", "enable_parallel_optimizer_overlap",
        "auto_parallel_search_mode")},
    **{k: GRAPH_PARALLEL for k in ("src_strategy_path_or_dir", "only_save_strategy", "transform_process_num",
                                   "micro_batch_interleave_num", "load_ckpt_format", "load_ckpt_async",
                                   "parallel_config.gradient_aggregation_group", "parallel_config.vocab_emb_dp")},
    **{k: PROFILER for k in ("profile", "profile_start_step", "profile_stop_step", "init_start_profile",
                             "profile_communication", "profile_memory", "profile_rank_ids", "profile_pipeline",
                             "profile_level", "profile_output", "auto_tune", "filepath_prefix", "autotune_per_step")},
    **{k: WRAPPER for k in ("runner_wrapper.type", "runner_wrapper.scale_sense", "runner_wrapper.scale_sense.type",
                            "runner_wrapper.scale_sense.loss_scale_value", "runner_wrapper.scale_sense.scale_factor",
                            "runner_wrapper.scale_sense.scale_window",
                            "runner_wrapper.local_norm", "runner_wrapper.calculate_per_token_loss",
                            "runner_wrapper.use_skip_data_by_global_norm", "runner_config.sink_mode",
                            "tensorboard.log_loss_scale_to_tensorboard",
                            "runner_config.sink_size", "optimizer.swap", "lr_schedule.warmup_lr_init",
                            "lr_schedule.decay_steps")},
    **{k: MISC for k in ("trainer.*", "metric.*", "layer_scale", "layer_decay", "lr_scale", "lr_scale_factor",
                         "remote_save_url", "use_legacy", "train_precision_sync",
                         "infer_precision_sync", "checkpoint.*", "model.model_config.type",
                         "runner_wrapper.use_clip_grad")},
    "trust_remote_code": REMOTE_CODE,
    **{k: MONITOR for k in ("print_separate_loss", "eval_callbacks", "eval_callbacks.*")},
    **{k: INFERENCE for k in ("processor.*", "predict_batch_size", "input_data", "adapter_id")},
    **{f"{d}.{k}": LOADER for d in ("train_dataset", "eval_dataset") for k in (
        "output_columns", "construct_args_key", "python_multiprocessing", "repeat", "numa_enable",
        "prefetch_size", "batch_size", "seed", "pad_token_id", "dynamic_batch",
        *(f"data_loader.{x}" for x in LOADER_KEYS if not (d == "train_dataset" and x in HF_LOADER_KEYS)),
        "num_parallel_workers", "drop_remainder")},
    "eval_dataset.data_loader.shuffle": LOADER, "eval_dataset.input_columns": LOADER,
    **{k: LOADER for k in ("train_dataset_task.*", "eval_dataset_task.*", "eval_step_interval",
                           "eval_epoch_interval")},
    **{f"callbacks.{k}": CHECKPOINT_IO for k in (
        "integrated_save", "checkpoint_format", "save_network_params", "save_trainable_params",
        "remove_redundancy", "embedding_local_norm_threshold", "save_checkpoint_seconds",
        "keep_checkpoint_per_n_minutes", "append_info", "directory", "prefix")},
    **{f"recompute_config.{k}": KERNELS for k in ("mp_comm_recompute", "parallel_optimizer_comm_recompute")},
}
# Callback types MindFormers has that do nothing here (their entries are dropped and listed)
CALLBACKS_NOT_APPLIED: Dict[str, str] = {
    "ObsMonitor": MONITOR, "SummaryMonitor": MONITOR, "TrainingStateMonitor": MONITOR, "ProfileMonitor": PROFILER,
    "TopkBiasBalanceCallback": MISC, "StressDetectCallBack": MONITOR, "ColdHotExpertMonitor": MISC,
    "MaxLogitsMonitor": MONITOR, "TrainFaultTolerance": MISC,
}

# ---------------------------------------------------------------------------------------------------
# PyNative TrainConfig dialect: user path -> schema path (applied)
PYNATIVE_ALIASES: Dict[str, str] = {
    "training.steps": "runner_config.max_steps", "training.local_batch_size": "runner_config.batch_size",
    "training.max_norm": "runner_config.max_grad_norm", "training.seed": "seed",
    "parallelism.tensor_parallel": "parallel_config.model_parallel",
    "parallelism.context_parallel": "parallel_config.context_parallel",
    "parallelism.context_parallel_method": "parallel_config.context_parallel_method",
    "parallelism.ulysses_degree_in_cp": "parallel_config.ulysses_degree_in_cp",
    "parallelism.pipeline_parallel": "parallel_config.pipeline_stage",
    "parallelism.pipeline_parallel_schedule": "parallel.pipeline_config.pipeline_scheduler",
    "parallelism.pipeline_parallel_interleave_num": "parallel.pipeline_config.pipeline_interleave",
    "parallelism.pipeline_parallel_layers_per_stage": "parallel.pipeline_config.layers_per_stage",
    "parallelism.sequence_parallel": "parallel_config.use_seq_parallel",
    "parallelism.data_parallel_shard": "parallel_config.data_parallel",
    "parallelism.expert_parallel": "parallel_config.expert_parallel",
    "lr_scheduler.type": "lr_schedule.type", "lr_scheduler.learning_rate": "lr_schedule.learning_rate",
    "lr_scheduler.warmup_steps": "lr_schedule.warmup_steps", "lr_scheduler.warmup_ratio": "lr_schedule.warmup_ratio",
    "lr_scheduler.lr_end": "lr_schedule.lr_end", "lr_scheduler.total_steps": "lr_schedule.total_steps",
    "optimizer.type": "optimizer.type", "optimizer.betas": "optimizer.betas", "optimizer.eps": "optimizer.eps",
    "optimizer.weight_decay": "optimizer.weight_decay", "optimizer.learning_rate": "optimizer.learning_rate",
    "train_dataset.dataloader.type": "train_dataset.type",
    "train_dataset.dataloader.dataset_dir": "train_dataset.dataset_dir",
    "train_dataset.dataloader.dataset_files": "train_dataset.dataset_dir",
    "train_dataset.dataloader.shuffle": "train_dataset.shuffle",
    "train_dataset.dataloader.config.data_path": "train_dataset.data_path",
    **{f"train_dataset.dataloader.{k}": f"train_dataset.{k}" for k in HF_LOADER_KEYS},   # HFDataLoader's keys
    "train_dataset.tokenizer_file": "train_dataset.tokenizer_file",
    "train_dataset.drop_remainder": "train_dataset.drop_remainder",
    "train_dataset.num_parallel_workers": "train_dataset.num_parallel_workers",
    "checkpoint.load_path": "load_checkpoint",
    "context.mode": "context.mode", "context.device_target": "context.device_target",
    "swap.enable": "swap_config.swap", "swap.default_prefetch": "swap_config.default_prefetch",
    "swap.layer_swap": "swap_config.layer_swap", "swap.op_swap": "swap_config.op_swap",
    "monitor.health_checkpoint.global_norm_skip_threshold": "runner_config.global_norm_skip_threshold",
    "training.use_skip_step_on_nan": "runner_config.use_skip_step_on_nan",
    "training.max_consecutive_skipped_steps": "runner_config.max_consecutive_skipped_steps",
    "monitor.tensorboard.output_dir": "tensorboard.tensorboard_dir",
    "monitor.tensorboard.queue_size": "tensorboard.tensorboard_queue_size",
    "monitor.tensorboard.log_interval": "tensorboard.log_interval",
    # our own top-level keys, the same in both dialects
    "output_dir": "output_dir", "run_mode": "run_mode", "use_parallel": "use_parallel",
    "resume_training": "resume_training", "load_checkpoint": "load_checkpoint", "seed": "seed",
    "auto_trans_ckpt": "auto_trans_ckpt", "overwrite_output_dir": "overwrite_output_dir",
    "pretrained_model_dir": "pretrained_model_dir",
}
# PyNative keys with their own code in dialects.py (batch sizes, checkpoint saving, model class, recompute, ...)
PYNATIVE_SPECIAL = ("training.global_batch_size", "training.rampup_batch_size", "checkpoint.enable_save",
                    "parallelism.data_parallel_shard_strategy", "recompute.full_recompute_layer",
                    "checkpoint.save_interleaved_steps", "checkpoint.save_max", "checkpoint.prefix",
                    "checkpoint.async_save",
                    "train_dataset.dataloader.column_names", "train_dataset.input_columns", "recompute.mode",
                    "lora_config", "lora_config.*", "callbacks", "callbacks.*", "eval_dataset", "eval_dataset.*",
                    "model", "model.*")

PYNATIVE_NOT_APPLIED: Dict[str, str] = {
    **{f"parallelism.{k}": GRAPH_PARALLEL for k in (
        "reshard_after_forward_policy", "cpu_offload", "disable_gradient_division",
        "dense_fsdp_shard_size", "context_parallel_async",
        "context_parallel_mask_type", "pipeline_parallel_microbatch_size", "pipeline_parallel_overlap_p2p",
        "pipeline_parallel_overlap_b_f", "pipeline_parallel_enable_dxdw_split", "pipeline_parallel_p2p_transport",
        "enable_mc2", "enable_loss_parallel", "npu_nums_per_device", "moe_token_dispatcher_type",
        "expert_parallel_async_d2h", "expert_parallel_use_safe_tokens")},
    "training.deterministic": MISC,
    **{f"checkpoint.{k}": CHECKPOINT_IO for k in (
        "save_path", "no_save_optim", "remove_redundancy", "load_balanced", "no_load_optim",
        "load_worker_number", "save_global_layout_cache", "reshard_worker_num")},
    "optimizer.weight_decay_include": MISC, "optimizer.weight_decay_exclude": MISC,
    "lr_scheduler.warmup_lr_init": WRAPPER, "lr_scheduler.decay_steps": WRAPPER,
    **{f"train_dataset.{k}": LOADER for k in ("prefetch_size", "numa_enable", "use_distribute_dataset",
                                              "dataloader.column_names",
                                              *(f"dataloader.{x}" for x in LOADER_KEYS))},
    **{f"monitor.{k}": MONITOR for k in (
        "health_checkpoint.embedding_local_norm_threshold", "health_checkpoint.global_norm_skip_threshold",
        "health_checkpoint.global_norm_skip_time", "train_state.local_norm", "train_state.local_loss",
        "train_state.device_norm", "train_state.device_loss",
        "moe_monitor.save_tokens_per_expert_interval", "moe_monitor.target_layers")},
    **{f"profiler.{k}": PROFILER for k in ("enable_profiling", "start_step", "end_step", "output_path",
                                           "profiler_rank", "profiler_level", "mstx", "profile_memory",
                                           "profile_cpu", "with_stack")},
    **{f"context.{k}": ASCEND for k in ("max_device_memory", "device_id", "jit_config.*", "ascend_config.*",
                                        "max_call_depth", "memory_optimize_level", "deterministic")},
    "recompute.select_module": KERNELS, "recompute.exclude_op": KERNELS,
    "recompute_comm.*": KERNELS, "trust_remote_code": REMOTE_CODE, "print_separate_loss": MONITOR,
    "callbacks.param": MISC,
}

# THE alias table: value names MindFormers (and Megatron / Hugging Face) use for what the schema calls otherwise,
# read as the schema's value wherever the key is set (file, override, PyNative name). Checked against MindFormers
# 167a50de: context_parallel_algo (ContextParallelAlgo: colossalai_cp, ulysses_cp; hybrid_cp and its old typo
# hybird_cp, core/parallel_config.py), dtypes (parallel_core ms_dtype_mapping: fp32/fp16/bf16), load balancing
# (router.py: sub_seq_aux_loss, seq_aux_loss, gbs_aux_loss; Megatron's global_aux_loss), schedules (the
# PyNative names, MindSpore's zero_bubble_v), lr schedules (core/lr registry, trainer LrSchedulerType).
_CP_ALGO = {"colossalai_cp": "colossal", "ulysses_cp": "ulysses", "hybrid_cp": "hybrid", "hybird_cp": "hybrid",
            "ring": "colossal"}
_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "float32": "float32", "float16": "float16",
          "bfloat16": "bfloat16"}
VALUE_ALIASES: Dict[str, Dict[object, object]] = {
    "parallel_config.context_parallel_algo": _CP_ALGO,
    "parallel_config.context_parallel_method": _CP_ALGO,
    "model.model_config.compute_dtype": _DTYPE,
    "model.model_config.param_init_dtype": _DTYPE,
    "model.model_config.moe_router_load_balancing_type": {"gbs_aux_loss": "aux_loss", "global_aux_loss": "aux_loss",
                                                          "sub_seq_aux_loss": "seq_aux_loss"},
    "optimizer.type": {"AdamWeightDecay": "AdamW", "FP32StateAdamWeightDecay": "AdamW",
                       "FusedAdamWeightDecay": "AdamW", "adamw": "AdamW", "AdamWeightDecayX": "AdamW"},
    "lr_schedule.type": {"polynomial": "LinearWithWarmUpLR", "PolynomialWithWarmUpLR": "LinearWithWarmUpLR",
                         "linear": "LinearWithWarmUpLR", "cosine": "CosineWithWarmUpLR",
                         "constant_with_warmup": "ConstantWarmUpLR"},
    "model.model_config.hidden_act": {"fusedswiglu": "swiglu", "fast_gelu": "gelu"},
    "parallel.pipeline_config.pipeline_scheduler": {"zero_bubble_v": "zbv", "zbv": "zbv", "1F1B": "1f1b", "dualpipev": "dualpipev",
                                                    "GPipe": "gpipe", "gpipe": "gpipe",
                                                    "interleaved_1f1b": "interleaved"},
    "train_dataset.type": {"MindDataset": "mindrecord", "BlendedMegatronDatasetDataLoader": "megatron",
                           "HFDataLoader": "hf"},
    "eval_dataset.type": {"MindDataset": "mindrecord"},
}
# Data loader types MindFormers has that are not read here: refused with what to use instead
LOADERS_NOT_IMPLEMENTED = ("CommonDataLoader", "SFTDataLoader",
                           "MultiSourceDataLoader", "ADGenDataLoader", "TrainingDataLoader")
