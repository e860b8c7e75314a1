"""TransformerConfig: every size and switch of the transformer model, checked once up front.

The model code reads only this object. Parallel sizes live here too, but the model never uses
them to compute anything: they exist so that ``shard()`` declarations can build layouts
(``config.layout``) and so that bad combinations (heads not divisible by the tensor-parallel
size, ...) fail here, with the field, the value and the rule, before any process is started.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

import mindspore as ms

from ..common.sequence_placement import normalize_algorithm, storage_positions
from ..common.sequence_placement import problems as cp_problems
from .yarn import yarn_problems

DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}
NORMALIZATIONS = ("RMSNorm", "LayerNorm")
ACTIVATIONS = ("swiglu", "gelu")
POSITION_EMBEDDINGS = ("rope",)


def _fail(field: str, value, rule: str):
    raise ValueError(f"TransformerConfig: {field}={value!r}: {rule}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class TransformerConfig:
    """Megatron-style names. ``num_query_groups=None`` means multi-head attention (one key/value
    head per query head); ``kv_channels=None`` means ``hidden_size // num_attention_heads``."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    ffn_hidden_size: Optional[int] = None          # None = 4 * hidden_size
    num_query_groups: Optional[int] = None
    kv_channels: Optional[int] = None
    normalization: str = "RMSNorm"
    activation: str = "swiglu"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    position_embedding_type: str = "rope"
    rotary_interleaved: bool = False               # rotate channel pairs (0,1), (2,3), ... (DeepSeek's rope_interleave)
    rotary_scaling: Optional[Any] = None           # YaRN: {type: yarn, factor, original_max_position_embeddings, ...}
    max_position_embeddings: Optional[int] = None  # rows of the by-position rotary tables (None: seq_length)
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    layernorm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False
    add_bias_linear: bool = False
    add_qkv_bias: bool = False                     # biases on q/k/v only (Qwen2.5); add_bias_linear implies them
    params_dtype: str = "float32"
    compute_dtype: str = "float32"
    data_parallel_size: int = 1
    tensor_model_parallel_size: int = 1
    context_parallel_size: int = 1
    context_parallel_algo: str = "colossal"        # colossal (ring) | ulysses | hybrid (MindFormers' names)
    ulysses_degree_in_cp: Optional[int] = None     # hybrid: Ulysses group size inside cp
    context_parallel_load_balance: bool = True     # causal ring: rank i holds chunks i and 2*ring-1-i
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    sequence_parallel: bool = False
    # ---- mixture of experts (docs/moe.md); num_moe_experts=None: every MLP is dense ----------
    num_moe_experts: Optional[int] = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: Optional[int] = None          # one routed expert's width (None = ffn_hidden_size)
    moe_shared_expert_intermediate_size: Optional[int] = None   # shared experts' total width (None/0 = none)
    moe_router_score_function: str = "softmax"         # softmax | sigmoid
    moe_router_num_groups: Optional[int] = None        # group-limited routing: expert groups
    moe_router_group_topk: Optional[int] = None        # ... of which each token may use this many
    moe_router_norm_topk_prob: bool = True             # renormalize the k chosen scores to sum 1
    moe_router_topk_scaling_factor: float = 1.0        # routed_scaling_factor
    moe_router_enable_expert_bias: bool = False        # selection bias, updated outside the gradient
    moe_router_bias_update_rate: float = 1e-3
    moe_router_load_balancing_type: str = "seq_aux_loss"   # seq_aux_loss | aux_loss | none
    moe_aux_loss_coeff: float = 0.0
    moe_aux_loss_micro_batches: int = 1                # aux_loss: f and P over each of m equal row groups, averaged
    #                                                    (what a pipeline of m microbatches computes)
    moe_expert_capacity_factor: Optional[float] = None     # None = dropless
    moe_token_drop_policy: str = "position"
    moe_first_k_dense_layers: int = 0                  # first_k_dense_replace: the first k layers stay dense
    moe_layer_freq: Any = 1                            # Megatron's: N = layers 0, N, 2N, ... are MoE; or a 0/1
    #                                                    list per layer (Qwen3-MoE's decoder_sparse_step/mlp_only_layers)
    expert_model_parallel_size: int = 1
    # ---- multi-token prediction (transformer/mtp.py; DeepSeek-V3) -----------------------------
    mtp_num_layers: Optional[int] = None               # MTP depths after the main model (None/0: none)
    mtp_loss_scaling_factor: float = 0.1               # the MTP term is factor x the mean of the depths' losses

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size if _is_int(self.hidden_size) else None
        self._check_sizes()
        self._check_choices()
        try:
            self.context_parallel_algo = normalize_algorithm(self.context_parallel_algo)
        except ValueError as e:
            _fail("context_parallel_algo", self.context_parallel_algo, str(e).split(": ", 1)[1])
        self._check_divisibility()
        self._check_dtypes()
        self._check_mtp()
        if self.num_moe_experts is not None or self.expert_model_parallel_size != 1:
            from .moe_config import moe_config_problems   # the MoE rules, apart from the MoE layer
            for field, value, rule in moe_config_problems(self):
                _fail(field, value, rule)

    # ---- validation ----------------------------------------------------------------------
    def _check_sizes(self):
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
                     "seq_length", "data_parallel_size", "tensor_model_parallel_size",
                     "context_parallel_size", "pipeline_model_parallel_size"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                _fail(name, v, "must be an integer >= 1")
        for name in ("num_query_groups", "kv_channels", "virtual_pipeline_model_parallel_size",
                     "max_position_embeddings"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                _fail(name, v, "must be null/None or an integer >= 1")
        for name in ("hidden_dropout", "attention_dropout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v < 1.0:
                _fail(name, v, "must be a probability in [0, 1)")
        for field, value, rule in yarn_problems(self.rotary_scaling):
            _fail(field, value, rule)
        if not isinstance(self.rotary_interleaved, bool):
            _fail("rotary_interleaved", self.rotary_interleaved, "must be true or false")
        if not isinstance(self.rotary_percent, (int, float)) or not 0.0 < self.rotary_percent <= 1.0:
            _fail("rotary_percent", self.rotary_percent, "must be in (0, 1]")
        for name in ("rotary_base", "init_method_std", "layernorm_epsilon"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                _fail(name, v, "must be a number > 0")
        for name in ("tie_word_embeddings", "add_bias_linear", "sequence_parallel",
                     "context_parallel_load_balance"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "must be true or false")

    def _check_choices(self):
        for name, choices in (("normalization", NORMALIZATIONS), ("activation", ACTIVATIONS),
                              ("position_embedding_type", POSITION_EMBEDDINGS),
                              ("params_dtype", tuple(DTYPES)), ("compute_dtype", tuple(DTYPES))):
            if getattr(self, name) not in choices:
                _fail(name, getattr(self, name), f"must be one of {list(choices)}")

    def _check_divisibility(self):
        heads, tp = self.num_attention_heads, self.tensor_model_parallel_size
        groups = self.query_groups
        if self.kv_channels is None and self.hidden_size % heads:
            _fail("hidden_size", self.hidden_size, f"must be divisible by num_attention_heads={heads} "
                  "(or set kv_channels)")
        if heads % tp:
            _fail("num_attention_heads", heads, f"must be divisible by tensor_model_parallel_size={tp}")
        if heads % groups:
            _fail("num_query_groups", groups, f"must divide num_attention_heads={heads}")
        if groups % tp:
            _fail("num_query_groups", groups, f"must be divisible by tensor_model_parallel_size={tp} "
                  "(every tensor-parallel rank needs whole key/value heads)")
        if self.ffn_hidden_size % tp:
            _fail("ffn_hidden_size", self.ffn_hidden_size, f"must be divisible by tensor_model_parallel_size={tp}")
        if self.vocab_size % tp:
            _fail("vocab_size", self.vocab_size, f"must be divisible by tensor_model_parallel_size={tp} "
                  "(pad the vocabulary)")
        if self.seq_length % self.context_parallel_size:
            _fail("seq_length", self.seq_length,
                  f"must be divisible by context_parallel_size={self.context_parallel_size}")
        for field, value, rule in cp_problems(self.seq_length, self.context_parallel_size, heads, groups, tp,
                                              self.context_parallel_algo, self.ulysses_degree_in_cp,
                                              self.context_parallel_load_balance):
            _fail(field, value, rule)
        if self.sequence_parallel and self.seq_length % (tp * self.context_parallel_size):
            _fail("seq_length", self.seq_length, "with sequence_parallel must be divisible by "
                  f"tensor_model_parallel_size x context_parallel_size = {tp * self.context_parallel_size}")
        rot = int(self.head_dim * self.rotary_percent)
        if rot < 2 or rot % 2:
            _fail("rotary_percent", self.rotary_percent, f"must rotate an even number >= 2 of the "
                  f"head_dim={self.head_dim} channels (got {rot})")

    def _check_mtp(self):
        n = self.mtp_num_layers
        if n is not None and (not _is_int(n) or n < 0):
            _fail("mtp_num_layers", n, "must be null/None or an integer >= 0 (the multi-token prediction depths)")
        f = self.mtp_loss_scaling_factor
        if not isinstance(f, (int, float)) or isinstance(f, bool) or f < 0:
            _fail("mtp_loss_scaling_factor", f, "must be a number >= 0")
        if n and self.pipeline_model_parallel_size > 1 and self.tie_word_embeddings:
            _fail("mtp_num_layers", n, f"with pipeline_model_parallel_size={self.pipeline_model_parallel_size} and "
                  "tie_word_embeddings=True: the last stage's output layer would need the embedding table itself; "
                  "use tie_word_embeddings=False under pipeline parallelism")

    def _check_dtypes(self):
        if "bfloat16" in (self.params_dtype, self.compute_dtype) and ms.get_context("device_target") == "CPU":
            name = "compute_dtype" if self.compute_dtype == "bfloat16" else "params_dtype"
            _fail(name, "bfloat16", "MindSpore's CPU kernels have no bfloat16 MatMul/BatchMatMul/Softmax; "
                  "use float32 or float16 on CPU")

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def query_groups(self) -> int:
        """Key/value heads (== num_attention_heads for multi-head attention)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def max_positions(self) -> int:
        """Positions the by-position rotary tables cover: ``max_position_embeddings``, at least ``seq_length``."""
        return max(self.seq_length, self.max_position_embeddings or 0)

    def token_positions(self):
        """Global position of the token in each sequence slot: the identity, except with load-balanced
        causal context parallelism (storage order, see ``common/sequence_placement.py``)."""
        return storage_positions(self.seq_length, self.context_parallel_size, self.context_parallel_algo,
                                 self.ulysses_degree_in_cp, self.context_parallel_load_balance)

    @property
    def ms_params_dtype(self):
        return DTYPES[self.params_dtype]

    @property
    def ms_compute_dtype(self):
        return DTYPES[self.compute_dtype]

    @property
    def layout(self):
        """The (dp, cp, tp) device matrix of ``shard()`` declarations: ``config.layout("dp", "cp", "tp")``.
        With expert parallelism data parallel is split into ("edp", "ep") and "dp" names both."""
        from ..sharding import Layout   # imported on use: the model itself never needs it
        if self.expert_model_parallel_size > 1:
            from ..sharding.expert_parallel import expert_mesh
            return expert_mesh(self.data_parallel_size, self.context_parallel_size, self.tensor_model_parallel_size,
                               self.expert_model_parallel_size)
        return Layout((self.data_parallel_size, self.context_parallel_size, self.tensor_model_parallel_size),
                      ("dp", "cp", "tp"))

    @property
    def mtp_depths(self) -> int:
        """Multi-token prediction depths (0: none)."""
        return self.mtp_num_layers or 0

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts is not None

    def is_moe_layer(self, layer_number: int) -> bool:
        """Layer ``layer_number`` (global, 1-based) has a mixture-of-experts MLP: past the first
        ``moe_first_k_dense_layers``, and one the ``moe_layer_freq`` pattern marks (an int N: layer
        indices 0, N, 2N, ...; a list: 1 per MoE layer, 0 per dense one)."""
        if not self.is_moe or layer_number <= self.moe_first_k_dense_layers:
            return False
        freq = self.moe_layer_freq
        if isinstance(freq, (list, tuple)):
            return bool(freq[layer_number - 1])
        return (layer_number - 1) % freq == 0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
