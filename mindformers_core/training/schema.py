"""The YAML schema: every key a config may hold, its accepted types, default and allowed values.

The schema is data, not code, so that one declaration drives defaults, type checks, unknown-key
suggestions and the field tables of ``docs/config.md`` (:func:`schema_markdown`). Key names follow
MindFormers' YAML (``parallel_config.data_parallel``, ``recompute_config.recompute``, ...); where we
differ, the field's ``doc`` says so. Cross-field rules (products, divisibility) live in :mod:`.rules`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

from ..pipeline.schedules import BUILTIN_SCHEDULES

REQUIRED = object()  # marker default: the key must be given


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Type tokens accepted in ``Field.types``; bool is never an int here, so `data_parallel: true` fails.
TYPE_CHECKS = {
    "int": _is_int,
    "float": _is_float,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "list[int]": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "list[float]": lambda v: isinstance(v, list) and all(_is_float(x) for x in v),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
}


@dataclass(frozen=True)
class Field:
    """One leaf key: accepted type tokens, default, optional enum ``choices`` and lower bound ``min``."""
    types: Tuple[str, ...]
    default: Any = REQUIRED
    doc: str = ""
    choices: Tuple[Any, ...] = ()
    min: Optional[float] = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    """A mapping of known keys; ``items`` set means a list of such mappings (e.g. ``callbacks``)."""
    fields: Mapping[str, Union[Field, "Section"]]
    doc: str = ""
    is_list: bool = False
    default_list: Tuple[Mapping[str, Any], ...] = field(default=())


def F(types: str, default: Any = REQUIRED, doc: str = "", choices=(), min=None) -> Field:
    """Compact constructor: ``F("int|null", None, "why", min=1)``."""
    return Field(tuple(types.split("|")), default, doc, tuple(choices), min)


PIPELINE_SCHEDULERS = tuple(BUILTIN_SCHEDULES)  # the names the runtime can build
# values MindFormers users may ask for that are known but not runnable yet: the error says what is missing
_SEQ_PIPE = "MindFormers' sequence-split pipeline schedules (seq_split_num) are not implemented"
_LR = "MindFormers' {} is not implemented here"
NOT_RUNNABLE: Dict[str, Dict[str, str]] = {
    "parallel.pipeline_config.pipeline_scheduler": {k: _SEQ_PIPE for k in ("seqpipe", "seqvpp", "seqsmartvpp")},
    "lr_schedule.type": {k: _LR.format(k) for k in (
        "ConstantWithCoolDownLR", "CosineWithRestartsAndWarmUpLR", "WarmUpStableDecayLR", "CosineAnnealingLR",
        "CosineAnnealingWarmRestarts", "LearningRateWiseLayer", "cosine_with_restarts")},
}

SCHEMA = Section({
    "seed": F("int", 0, "Global random seed (MindSpore, NumPy, data shuffling).", min=0),
    "output_dir": F("str", "./output", "Where checkpoints, logs and the loss JSONL are written."),
    "overwrite_output_dir": F("bool", False, "Let a fresh (non-resumed) run replace the loss log and checkpoints "
                                             "of an earlier run in output_dir; without it such a start is refused."),
    "run_mode": F("str", "train", "What run_mindformer.py does.", choices=("train", "finetune", "eval", "predict")),
    "use_parallel": F("bool", False, "Run distributed (under msrun). Must be true when worker count > 1."),
    "load_checkpoint": F("str|null", None, "Checkpoint directory or file to load; empty/null = none."),
    "resume_training": F("bool|str", False, "Resume optimizer, step and data state; a string names the "
                                             "checkpoint to resume from."),
    "resume_fallback_to_intact": F("bool", False, "When the checkpoint to load fails verification (checksum, "
                                                  "missing file), load the newest older intact step of the same "
                                                  "directory with a warning instead of stopping."),
    "auto_trans_ckpt": F("bool", False, "Reshard a checkpoint saved with another parallel layout on load."),
    "pretrained_model_dir": F("str|null", None, "A Hugging Face model folder: its config.json (and "
                              "generation_config.json) is read into model.model_config before validation; keys the "
                              "YAML's model_config gives override it; its architectures / model_type choose the "
                              "registered model (MindFormers' key; also model.pretrained_model_dir and the "
                              "--pretrained_model_dir flag). Only JSON is read from it."),
    "context": Section({
        "mode": F("int", 1, "0 = GRAPH_MODE (ms.jit), 1 = PYNATIVE_MODE.", choices=(0, 1)),
        "device_target": F("str", "CPU", "MindSpore device.", choices=("CPU", "GPU", "Ascend")),
        "cpu_threads": F("int|null", None, "Ours: MindSpore CPU kernel threads per worker "
                         "(device_context.cpu.op_tuning.threads_num); null = cores // workers on the host; "
                         "the MFC_CPU_THREADS environment variable wins.", min=1),
        "pynative_synchronize": F("bool|null", None, "Eager (PyNative) ops run in the calling thread instead of "
                                  "MindSpore's dispatch queue, whose spinning waits slow CPU runs; null = true on "
                                  "CPU, false elsewhere; the MFC_PYNATIVE_SYNC environment variable (0/1) wins."),
    }, "MindSpore context (mindspore.set_context)."),
    "parallel_config": Section({
        "data_parallel": F("int", 1, "Data-parallel size (dp).", min=1),
        "model_parallel": F("int", 1, "Tensor-parallel size (mp / tp).", min=1),
        "pipeline_stage": F("int", 1, "Pipeline-parallel size (pp), number of pipeline ranks.", min=1),
        "context_parallel": F("int", 1, "Context-parallel size (cp): the sequence is split over cp ranks.",
                              min=1),
        "context_parallel_algo": F("str", "colossal", "Context-parallel attention (MindFormers' names): colossal "
                                   "= ring attention, ulysses = all-to-all to heads, hybrid = Ulysses inside "
                                   "groups of ulysses_degree_in_cp, ring across ('ring' = colossal).",
                                   choices=("colossal", "ulysses", "hybrid", "ring")),
        "context_parallel_method": F("str|null", None, "MindFormers' PyNative name of context_parallel_algo; "
                                     "when set it wins."),
        "ulysses_degree_in_cp": F("int|null", None, "hybrid: Ulysses group size inside context_parallel.", min=1),
        "context_parallel_load_balance": F("bool", True, "Causal ring load balancing (ours): rank i holds sequence "
                                           "chunks i and 2*cp-1-i; seq_length divisible by 2*cp."),
        "expert_parallel": F("int", 1, "Expert-parallel size (ep): a MoE model's experts split over ep ranks, "
                                       "carved out of data_parallel (which it must divide).", min=1),
        "micro_batch_num": F("int", 1, "Micro-batches per step for pipeline parallelism.", min=1),
        "use_seq_parallel": F("bool", False, "Sequence parallelism inside tensor-parallel regions."),
        "vocab_emb_dp": F("bool", True, "Keep the embedding table data-parallel (not split by mp)."),
        "gradient_aggregation_group": F("int", 4, "Gradients fused per all-reduce bucket.", min=1),
        "rank_order": F("str", "tp-cp-ep-dp-pp", "Order (ours) in which the parallel dimensions are laid over "
                                                 "consecutive ranks, first = fastest varying: tokens from tp, "
                                                 "cp, ep, dp, pp joined by '-', none repeated. The default is "
                                                 "Megatron's; e.g. 'tp-dp-pp' keeps a tensor-parallel group "
                                                 "on neighbouring ranks."),
    }, "Parallel sizes. dp x mp x cp x pp must equal the worker count."),
    "parallel": Section({
        "enable_parallel_optimizer": F("bool", False, "Shard over data parallel with hsdp (ZeRO); the `hsdp` "
                                                      "block sets the level (default level1: optimizer state)."),
        "pipeline_config": Section({
            "pipeline_interleave": F("int", 1, "Virtual stages per pipeline rank (vpp). MindFormers uses a "
                                               "bool here plus model_config.pp_interleave_num; we take the "
                                               "number directly.", min=1),
            "pipeline_scheduler": F("str", "1f1b", "Pipeline schedule. gpipe/1f1b/zb_h1/dualpipe need "
                                                   "pipeline_interleave 1, interleaved > 1, zbv and dualpipev "
                                                   "exactly 2 (dualpipev: micro_batch_num >= 2 x pipeline_stage; "
                                                   "dualpipe: even pipeline_stage, even micro_batch_num >= 2 x "
                                                   "pipeline_stage, two weight copies per rank).",
                                    choices=PIPELINE_SCHEDULERS),
            "layers_per_stage": F("list|str|null", None, "Explicit layer split (ours): layer counts per stage "
                                                          "([3, 5]) or layer ranges (['0-2', '3-7']); 'auto' = "
                                                          "measure the layers and plan (pipeline.planner)."),
        }, "Pipeline schedule choice."),
    }, "Parallel features beyond the sizes."),
    "recompute_config": Section({
        "recompute": F("bool|list[int]", False, "Recompute whole layers; a list gives layers per stage."),
        "select_recompute": F("bool|list|dict", False, "Recompute selected ops (activations, norms); a list of "
                                                       "patterns or a mapping pattern -> bool / layers per stage."),
        "select_comm_recompute": F("bool|list|dict", False, "Recompute selected communication ops (same forms)."),
        "select_recompute_exclude": F("bool|list|dict", False, "Patterns excluded from select_recompute."),
        "select_comm_recompute_exclude": F("bool|list|dict", False, "Patterns excluded from select_comm_recompute."),
        "recompute_slice_activation": F("bool", False, "Keep recomputation checkpoints sliced by mp."),
    }, "Activation recomputation."),
    "swap_config": Section({
        "swap": F("bool", False, "Offload activations to host memory."),
        "default_prefetch": F("int", 1, "Layers prefetched ahead when swapping back.", min=1),
        "layer_swap": F("list|null", None, "Per-layer swap rules (MindFormers format)."),
        "op_swap": F("list|null", None, "Per-op swap rules (MindFormers format)."),
    }, "Activation swapping (host offload)."),
    "model": Section({
        "arch": Section({"type": F("str", "LlamaForCausalLM", "Model class name.")}, "Model class."),
        "model_config": Section({
            "type": F("str", "LlamaConfig", "Config class name (kept for MindFormers compatibility)."),
            "num_layers": F("int", doc="Transformer layers.", min=1),
            "hidden_size": F("int", doc="Model width; divisible by num_heads.", min=1),
            "ffn_hidden_size": F("int|null", None, "MLP width; null = derived from hidden_size.", min=1),
            "num_heads": F("int", doc="Attention heads; divisible by model_parallel.", min=1),
            "n_kv_heads": F("int|null", None, "Key/value heads (GQA); null = num_heads.", min=1),
            "num_query_groups": F("int|null", None, "Megatron name for n_kv_heads; give at most one.", min=1),
            "vocab_size": F("int", doc="Vocabulary size.", min=1),
            "seq_length": F("int", doc="Training sequence length; divisible by context_parallel.", min=1),
            "max_position_embeddings": F("int|null", None, "RoPE table length; null = seq_length.", min=1),
            "rms_norm_eps": F("float|null", None, "RMSNorm epsilon; null = the family's (1e-5 Llama, 1e-6 Qwen).",
                              min=0),
            "rope_theta": F("float", 10000.0, "RoPE base.", min=0),
            "hidden_act": F("str", "silu", "MLP activation; silu and swiglu both mean the gated SwiGLU MLP.",
                            choices=("silu", "swiglu", "gelu", "relu")),
            "add_qkv_bias": F("bool|null", None, "Biases on the query/key/value projections (Qwen2.5, GLM4); "
                                                 "MindFormers' qkv_has_bias, HF attention_bias; null = the family's "
                                                 "(true for Qwen2ForCausalLM)."),
            "qk_layernorm": F("bool|null", None, "Qwen3's q/k norm: RMSNorm of each query and key head before RoPE "
                                                 "(mcore's qk_layernorm, use_qk_norm); null = the family's (true for "
                                                 "Qwen3ForCausalLM and Qwen3MoeForCausalLM)."),
            "head_dim": F("int|null", None, "Size of one attention head (mcore's kv_channels); null = hidden_size / "
                                            "num_heads. Qwen3: 128 with hidden 5120 and 64 heads (q projects "
                                            "hidden -> num_heads x head_dim).", min=1),
            # multi-latent attention (DeepSeek-V3, transformer/mla.py; docs/deepseek_v3.md) and YaRN
            "q_lora_rank": F("int|null", None, "MLA: the query latent's size; null/0 = a plain q projection "
                                               "(DeepSeek-V2-Lite).", min=0),
            "kv_lora_rank": F("int|null", None, "MLA: the key/value latent's size (DeepSeek-V3: 512); needed by "
                                                "DeepseekV3ForCausalLM.", min=1),
            "qk_nope_head_dim": F("int|null", None, "MLA: each head's non-rotary query/key part.", min=1),
            "qk_rope_head_dim": F("int|null", None, "MLA: the rotary query/key part (one key part shared by the "
                                                    "heads); even.", min=1),
            "v_head_dim": F("int|null", None, "MLA: each head's value size.", min=1),
            "rope_scaling": F("dict|null", None, "YaRN rotary scaling (config.json's rope_scaling: type yarn, factor, "
                                                 "original_max_position_embeddings, beta_fast, beta_slow, mscale, "
                                                 "mscale_all_dim); null = plain RoPE."),
            "rope_interleave": F("bool|null", None, "Rotate channel pairs (0,1), (2,3), ... (DeepSeek's "
                                                    "checkpoints) instead of halves; null = the family's."),
            "tie_word_embeddings": F("bool", False, "Share embedding and output weights."),
            "compute_dtype": F("str", "float32", "Matmul dtype.", choices=("float32", "float16", "bfloat16")),
            "param_init_dtype": F("str", "float32", "Parameter dtype.",
                                  choices=("float32", "float16", "bfloat16")),
            "use_flash_attention": F("bool", False, "Fused (flash) attention; true is accepted on CPU with one "
                                                    "start-up line: the same attention is computed unfused."),
            "pet_config": F("dict|null", None, "LoRA fine-tuning (MindFormers' pet_config: pet_type lora, lora_rank, "
                                               "lora_alpha, lora_dropout, target_modules regex; the PyNative "
                                               "dialect's lora_config maps here; docs/finetune.md)."),
            "multi_latent_attention": F("bool|null", None, "MLA on (DeepseekV3ForCausalLM: its default, with "
                                                           "kv_lora_rank); true on another family is refused."),
            "mtp_num_layers": F("int|null", None, "Multi-token prediction depths after the main model (DeepSeek-V3: 1; "
                                                  "MindFormers' mtp_depth / num_nextn_predict_layers; docs/deepseek_v3.md); "
                                                  "null or 0 = none.", min=0),
            "mtp_loss_scaling_factor": F("float", 0.1, "The MTP term added to the loss is this x the mean of the "
                                                       "depths' losses (MindFormers' mtp_loss_factor).", min=0),
            # generation (run_mode predict; docs/generation.md): MindFormers' model_config keys, over the model
            # folder's generation_config.json, under the command line's flags; null = not set here
            "do_sample": F("bool|null", None, "predict: sample (true) or greedy (false)."),
            "top_k": F("int|null", None, "predict with do_sample: keep the k likeliest tokens (0 = all).", min=0),
            "top_p": F("float|null", None, "predict with do_sample: keep the likeliest tokens up to this "
                                           "probability mass, in (0, 1]."),
            "temperature": F("float|null", None, "predict with do_sample: divide the logits by it (> 0)."),
            "repetition_penalty": F("float|null", None, "predict: Hugging Face's repetition penalty (> 0; 1.0 = "
                                                        "none)."),
            "max_decode_length": F("int|null", None, "predict: prompt + new tokens at most (Hugging Face's "
                                                     "max_length); max_new_tokens wins when both are set.", min=1),
            "max_new_tokens": F("int|null", None, "predict: new tokens at most.", min=1),
            "min_new_tokens": F("int|null", None, "predict: no EOS before this many new tokens.", min=0),
            "eos_token_id": F("int|list[int]|null", None, "predict: the token id(s) that end a row; null = the "
                                                          "folder's generation_config.json, else the tokenizer's."),
            "pad_token_id": F("int|null", None, "predict: the id fed to finished rows and left padding; null = "
                                                "generation_config.json's, else the tokenizer's.", min=0),
            "offset": F("int|list[int]", 0, "MindFormers layer split: per-stage adjustments added to "
                                            "num_layers // stages; must sum to num_layers % stages."),
            # mixture of experts (docs/moe.md): Qwen3-MoE / mcore names; DeepSeek-V3's moe_config maps here
            "num_experts": F("int|null", None, "Routed experts per MoE layer (null or 1 = dense model).", min=1),
            "num_experts_per_tok": F("int", 2, "Experts each token is routed to (top-k).", min=1),
            "moe_intermediate_size": F("int|null", None, "One routed expert's MLP width; null = ffn_hidden_size.",
                                       min=1),
            "n_shared_experts": F("int|null", None, "Shared experts (one MLP of n x moe_intermediate_size seen by "
                                                    "every token).", min=0),
            "moe_shared_expert_intermediate_size": F("int|null", None, "Shared experts' total width (wins over "
                                                                       "n_shared_experts).", min=0),
            "first_k_dense_replace": F("int", 0, "The first k layers keep a dense MLP.", min=0),
            "moe_layer_freq": F("int|list[int]", 1, "Which layers are MoE (Megatron's): N = layers 0, N, 2N, ...; a "
                                                    "list = 1 (MoE) or 0 (dense) per layer.", min=1),
            "decoder_sparse_step": F("int", 1, "Qwen3-MoE: layer i (0-based) is MoE when (i + 1) % step == 0 ...",
                                     min=1),
            "mlp_only_layers": F("list[int]", [], "... and i is not in this list (Hugging Face's Qwen3-MoE keys; "
                                                  "read into moe_layer_freq)."),
            "scoring_func": F("str", "softmax", "Router scores.", choices=("softmax", "sigmoid")),
            "norm_topk_prob": F("bool|null", None, "Renormalize the chosen experts' scores to sum 1; null = the "
                                                   "family's (true; false for Qwen3MoeForCausalLM, as Hugging Face)."),
            "routed_scaling_factor": F("float", 1.0, "Factor on the routed experts' weights.", min=0),
            "n_group": F("int|null", None, "Group-limited routing: expert groups.", min=1),
            "topk_group": F("int|null", None, "Group-limited routing: groups a token may use.", min=1),
            "moe_router_enable_expert_bias": F("bool", False, "Aux-loss-free balancing: a selection bias per "
                                                              "expert, updated after each step."),
            "moe_router_bias_update_rate": F("float", 0.001, "Step of the expert-bias update.", min=0),
            "moe_aux_loss_coeff": F("float|null", None, "Load-balancing loss coefficient (0 = none); null = the "
                                                        "family's (0; 0.001 for Qwen3MoeForCausalLM).", min=0),
            "moe_aux_loss_micro_batches": F("int", 1, "aux_loss only: take f and P over each of this many equal "
                                                      "row groups of the batch and average their losses, as a "
                                                      "pipeline of this many microbatches does (a one-process run "
                                                      "that reproduces a pp run's loss).", min=1),
            "moe_router_load_balancing_type": F("str|null", None, "Load-balancing loss: per sequence (seq_aux_loss) "
                                                                  "or over the batch (aux_loss; MindFormers' "
                                                                  "gbs_aux_loss); null = the family's (seq_aux_loss; "
                                                                  "aux_loss for Qwen3MoeForCausalLM).",
                                                choices=("seq_aux_loss", "aux_loss", "none")),
            "moe_expert_capacity_factor": F("float|null", None, "Expert capacity (x the even share); null = "
                                                                "dropless.", min=0),
            "moe_token_drop_policy": F("str", "position", "Which rows past the capacity are dropped.",
                                       choices=("position", "probs")),
        }, "Architecture hyper-parameters."),
    }, "The model."),
    "train_dataset": Section({
        "type": F("str", "text", "Input format (megatron: .bin/.idx prefixes in data_path; hf: MindFormers' "
                  "HFDataLoader, local files through the datasets library and the handler chain).",
                  choices=("text", "jsonl", "mindrecord", "megatron", "hf")),
        "load_func": F("str", "load_dataset", "type hf: load_dataset (data files or a folder of them) or "
                       "load_from_disk (a save_to_disk folder).", choices=("load_dataset", "load_from_disk")),
        "path": F("str|null", None, "type hf: a local .json/.jsonl/.parquet/.csv/.arrow file or folder, a "
                  "save_to_disk folder, or a builder name (json, parquet, csv, arrow) with data_files; hub names "
                  "are not downloaded."),
        "data_files": F("str|list|null", None, "type hf: files for a builder name in path."),
        "split": F("str|null", "train", "type hf: the split (train, train[:100], train[:50%])."),
        "handler": F("list|null", None, "type hf: the handler chain (take/select_columns/rename_column/..., "
                     "AlpacaInstructDataHandler or ChatTemplateDataHandler, PackingHandler); docs/finetune.md."),
        "input_columns": F("list|null", None, "type hf: batch keys fed to the model (input_ids, labels, "
                           "loss_mask, position_ids; packed rows always feed segment_ids); other types read tokens only."),
        "create_attention_mask": F("bool", False, "type hf: MindFormers' per-document mask column; here packed "
                                   "documents are always kept apart by segment_ids (the model's AttentionMask)."),
        "create_compressed_eod_mask": F("bool", False, "type hf: MindFormers' compressed end-of-document list; "
                                        "here it caps documents per packed row at compressed_eod_mask_length."),
        "compressed_eod_mask_length": F("int", 128, "type hf: most documents in one packed row when "
                                        "create_compressed_eod_mask is set.", min=1),
        "use_broadcast_data": F("bool", True, "type hf: MindFormers broadcasts rows within a tp group; here every "
                                "rank reads the same rows (same result)."),
        "dataset_dir": F("str|null", None, "File or directory; null = the built-in corpus."),
        "data_path": F("str|list|null", None, "type megatron: a .bin/.idx prefix, or [weight, prefix, ...] "
                                              "blended by weight (MindFormers' data_loader.config.data_path)."),
        "tokenizer_file": F("str|null", None, "SentencePiece model; null = train one on the corpus."),
        "shuffle": F("bool", True, "Shuffle samples (deterministically, from seed)."),
        "drop_remainder": F("bool", True, "Drop the last incomplete batch."),
        "num_parallel_workers": F("int", 1, "mindspore.dataset worker threads.", min=1),
    }, "Training data."),
    "eval_dataset": Section({
        "type": F("str", "text", "Input format (as train_dataset.type).", choices=("text", "jsonl", "mindrecord")),
        "dataset_dir": F("str|null", None, "File or directory of held-out data; EvalCallBack needs it."),
        "eval_steps": F("int", 4, "Batches (of batch_size rows per data-parallel rank) per evaluation.", min=1),
    }, "Held-out data for EvalCallBack (same tokenizer and seq_length as training; read in file order)."),
    "optimizer": Section({
        "type": F("str", "AdamW", "Optimizer.", choices=("AdamW", "Adam", "SGD")),
        "learning_rate": F("float", 1e-3, "Peak learning rate (lr_schedule overrides when set).", min=0),
        "betas": F("list[float]", [0.9, 0.95], "Adam betas, two numbers."),
        "eps": F("float", 1e-8, "Adam epsilon.", min=0),
        "weight_decay": F("float", 0.0, "Decoupled weight decay.", min=0),
    }, "Optimizer."),
    "lr_schedule": Section({
        "type": F("str", "ConstantWarmUpLR", "Schedule (MindFormers names).",
                  choices=("ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR")),
        "learning_rate": F("float|null", None, "Peak rate; null = optimizer.learning_rate.", min=0),
        "lr_end": F("float", 0.0, "Final rate for decaying schedules.", min=0),
        "warmup_ratio": F("float", 0.0, "Warm-up as a fraction of total steps.", min=0),
        "warmup_steps": F("int|null", None, "Warm-up steps; overrides warmup_ratio.", min=0),
        "total_steps": F("int", -1, "Steps the schedule spans; -1 = epochs x steps per epoch."),
    }, "Learning-rate schedule."),
    "runner_config": Section({
        "epochs": F("int", 1, "Passes over the dataset.", min=1),
        "max_steps": F("int", -1, "Stop after this many optimizer steps (-1 = the epochs decide)."),
        "max_grad_norm": F("float", 1.0, "Global-norm gradient clipping (correct under dp/tp); 0 = off."),
        "log_grad_norm": F("bool", True, "Compute and log the global gradient norm every step. false: skip it "
                                         "when nothing else needs it (max_grad_norm 0, use_skip_step_on_nan off, "
                                         "no global_norm_skip_threshold, no hsdp): one reduction over every "
                                         "gradient less per step, grad_norm null in loss.jsonl."),
        "batch_size": F("int", 1, "Samples per data-parallel rank per step.", min=1),
        "sink_mode": F("bool", False, "Data sinking (Ascend); ignored on CPU."),
        "sink_size": F("int", 1, "Steps per sink when sink_mode is on.", min=1),
        "gradient_accumulation_steps": F("int", 1, "Micro-steps accumulated per optimizer step.", min=1),
        "use_skip_step_on_nan": F("bool", True, "Skip (on every rank) an optimizer step whose gradient norm is "
                                                "NaN/inf: weights, moments and the step counter stay "
                                                "(MindFormers' training.use_skip_step_on_nan)."),
        "global_norm_skip_threshold": F("float|null", None, "Also skip a step whose gradient norm (before "
                                                            "clipping) exceeds this; null = no limit (MindFormers' "
                                                            "monitor.health_checkpoint.global_norm_skip_threshold).",
                                        min=0),
        "max_consecutive_skipped_steps": F("int", 5, "Stop the run after this many skipped steps in a row "
                                                     "(MindFormers' training.max_consecutive_skipped_steps).",
                                           min=1),
        "max_restarts": F("int", 0, "Restart a failed or stalled job from its latest checkpoint up to this many "
                                    "times (the supervisor; run_mindformer.py --max_restarts and the launcher's "
                                    "MAX_RESTARTS override it).", min=0),
        "heartbeat_timeout": F("float", 600.0, "With restarts: seconds without a finished step before the job "
                                               "counts as stalled (--heartbeat_timeout, HEARTBEAT_TIMEOUT override "
                                               "it).", min=0.001),
    }, "Training loop."),
    "callbacks": Section({
        "type": F("str", doc="Callback class.", choices=("MFLossMonitor", "CheckpointMonitor", "EvalCallBack")),
        "per_print_times": F("int", 1, "MFLossMonitor: print every N steps.", min=1),
        "log_file": F("str|null", None, "MFLossMonitor: JSONL loss log; null = <output_dir>/loss.jsonl."),
        "save_checkpoint_steps": F("int", 100, "CheckpointMonitor: save every N steps.", min=1),
        "keep_checkpoint_max": F("int", 5, "CheckpointMonitor: checkpoints kept.", min=1),
        "prefix": F("str", "llama", "CheckpointMonitor: checkpoint name prefix."),
        "async_save": F("bool", False, "CheckpointMonitor: save in a background thread while training goes "
                                             "on (at most one save in flight; a failed save is reported and the "
                                             "previous checkpoint stays latest)."),
        "eval_interval": F("int", 100, "EvalCallBack: evaluate every N steps.", min=1),
    }, "List of callbacks, each a mapping with `type`.", is_list=True,
        default_list=({"type": "MFLossMonitor"},)),
    "tensorboard": Section({
        "tensorboard_dir": F("str|null", None, "Directory for TensorBoard event files (loss, learning-rate, "
                                               "grad-norm, throughput, MoE load); null or '' = none. Rank 0 "
                                               "writes (PyNative: monitor.tensorboard.output_dir)."),
        "tensorboard_queue_size": F("int", 10, "Events buffered before a write to disk (PyNative: "
                                               "monitor.tensorboard.queue_size).", min=1),
        "log_interval": F("int", 1, "Write every N steps (PyNative: monitor.tensorboard.log_interval).", min=1),
        "log_timers_to_tensorboard": F("bool", False, "Also write iteration-time (seconds per step)."),
        "log_expert_load_to_tensorboard": F("bool", True, "MoE models: tokens per expert per layer "
                                                          "(expert-load/layer_<i>/ep_<j>); MindFormers' default "
                                                          "is False."),
    }, "TensorBoard event files (MindFormers' graph-mode `tensorboard` block; docs/monitoring.md)."),
    "hsdp": Section({
        "shard_size": F("int", -1, "Ranks a parameter is sharded over; -1 = all of data_parallel, else "
                                   "a divisor of data_parallel."),
        "threshold": F("int", 64, "Parameters smaller than this (KB) stay replicated.", min=0),
        "optimizer_level": F("str", "level1", "level1 shards optimizer state, level2 also gradients, "
                                              "level3 also weights.", choices=("level1", "level2", "level3")),
    }, "Hybrid sharded data parallel (ours); applied when parallel.enable_parallel_optimizer is True."),
})


def iter_fields(section: Section = SCHEMA, prefix: str = "") -> Iterator[Tuple[str, Union[Field, Section]]]:
    """Every (dotted path, node) in the schema, sections before their fields."""
    for name, node in section.fields.items():
        path = f"{prefix}{name}"
        yield path, node
        if isinstance(node, Section):
            yield from iter_fields(node, path + ".")


def lookup(path: str) -> Optional[Union[Field, Section]]:
    """The schema node at a dotted path, or None (list sections are not indexable by path)."""
    node: Union[Field, Section] = SCHEMA
    for part in path.split("."):
        if not isinstance(node, Section) or node.is_list or part not in node.fields:
            return None
        node = node.fields[part]
    return node


def describe(f: Field) -> str:
    """Human rule for a field, used in type errors and docs: ``int >= 1`` or ``one of ['a', 'b']``."""
    text = " or ".join(f.types)  # not "|": it would split a markdown table cell
    if f.choices:
        text += f", one of {list(f.choices)}"
    if f.min is not None:
        text += f", >= {f.min:g}"
    return text


def schema_markdown() -> str:
    """The field tables of docs/config.md, generated so docs cannot drift from the schema."""
    out = ["### top level", "", "| key | type / rule | default | meaning |", "|---|---|---|---|"]
    for path, node in iter_fields():
        if isinstance(node, Section):
            kind = " (a list of mappings)" if node.is_list else ""
            out += ["", f"### `{path}`{kind}", "", node.doc, "", "| key | type / rule | default | meaning |",
                    "|---|---|---|---|"]
            continue
        default = "**required**" if node.required else f"`{node.default!r}`"
        out.append(f"| `{path}` | {describe(node)} | {default} | {node.doc} |")
    return "\n".join(out).strip() + "\n"


def default_tree(section: Section = SCHEMA) -> Dict[str, Any]:
    """Defaults of a section (required fields omitted): what `key: {}` expands to."""
    out: Dict[str, Any] = {}
    for name, node in section.fields.items():
        if isinstance(node, Section):
            out[name] = [dict(d) for d in node.default_list] if node.is_list else default_tree(node)
        elif not node.required:
            out[name] = list(node.default) if isinstance(node.default, list) else node.default
    return out
