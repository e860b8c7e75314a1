"""Single-card transformer model code (GPT / Llama) with ``shard()`` declarations and no
communication: parallelism is applied from outside by the sharding pass. See docs/transformer.md.
"""
from .attention import AttentionMask, DotProductAttention, HeadNorm, SelfAttention, causal_mask
from .block import TransformerBlock, stage_of
from .config import TransformerConfig
from .embedding import LanguageModelEmbedding, VocabParallelEmbedding
from .gpt_model import BATCH_KEYS, GPTModel, TiedOutputLayer
from .init import init_weights
from .layer import TransformerLayer, gpt_layer_spec
from .linear import ColumnParallelLinear, RowParallelLinear, sequence_parallel_layout
from .loss import MaskedMean, VocabParallelCrossEntropy
from .mlp import GELU, MLP, SwiGLU
from .moe import AuxLossProbe, LoadBalancingLoss, MoELayer, RoutedExperts, TopKRouter, update_expert_bias
from .norm import LayerNorm, RMSNorm, build_norm
from .rotary import PositionRotary, RotaryEmbedding, rotary_tables
from .spec import AttentionSpec, LayerSpec, spec_for_layer

ATOMIC_CELLS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, RMSNorm, LayerNorm,
                RotaryEmbedding, PositionRotary, AttentionMask, VocabParallelCrossEntropy, TiedOutputLayer, TopKRouter,
                RoutedExperts, AuxLossProbe)

__all__ = ["ATOMIC_CELLS", "AttentionMask", "AttentionSpec", "AuxLossProbe", "BATCH_KEYS", "ColumnParallelLinear",
           "DotProductAttention", "GELU", "GPTModel", "HeadNorm", "LanguageModelEmbedding", "LayerNorm", "LayerSpec",
           "LoadBalancingLoss", "MLP", "MaskedMean", "MoELayer", "PositionRotary", "RMSNorm", "RotaryEmbedding",
           "RoutedExperts", "RowParallelLinear", "SelfAttention", "SwiGLU", "TiedOutputLayer", "TopKRouter",
           "TransformerBlock", "TransformerConfig", "TransformerLayer", "VocabParallelCrossEntropy",
           "VocabParallelEmbedding", "build_norm", "causal_mask", "gpt_layer_spec", "init_weights", "rotary_tables",
           "sequence_parallel_layout", "spec_for_layer", "stage_of", "update_expert_bias"]
