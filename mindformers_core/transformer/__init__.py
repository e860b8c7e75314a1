"""Single-card transformer model code (GPT / Llama) with ``shard()`` declarations and no
communication: parallelism is applied from outside by the sharding pass. See docs/transformer.md.
"""
from .attention import DotProductAttention, SelfAttention, causal_mask
from .block import TransformerBlock, stage_of
from .config import TransformerConfig
from .embedding import LanguageModelEmbedding, VocabParallelEmbedding
from .gpt_model import GPTModel, TiedOutputLayer
from .init import init_weights
from .layer import TransformerLayer
from .linear import ColumnParallelLinear, RowParallelLinear, sequence_parallel_layout
from .loss import VocabParallelCrossEntropy
from .mlp import GELU, MLP, SwiGLU
from .moe import (AuxLossProbe, LoadBalancingLoss, MoELayer, MoETransformerLayer, RoutedExperts, TopKRouter,
                  moe_layer_spec, update_expert_bias)
from .norm import LayerNorm, RMSNorm, build_norm
from .rotary import RotaryEmbedding, rotary_tables

ATOMIC_CELLS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, RMSNorm, LayerNorm,
                RotaryEmbedding, VocabParallelCrossEntropy, TiedOutputLayer, TopKRouter, RoutedExperts, AuxLossProbe)

__all__ = ["ATOMIC_CELLS", "AuxLossProbe", "ColumnParallelLinear", "DotProductAttention", "GELU", "GPTModel",
           "LanguageModelEmbedding", "LayerNorm", "LoadBalancingLoss", "MLP", "MoELayer", "MoETransformerLayer",
           "RMSNorm", "RotaryEmbedding", "RoutedExperts", "RowParallelLinear", "SelfAttention", "SwiGLU",
           "TiedOutputLayer", "TopKRouter", "TransformerBlock", "TransformerConfig", "TransformerLayer",
           "VocabParallelCrossEntropy", "VocabParallelEmbedding", "build_norm", "causal_mask", "init_weights",
           "moe_layer_spec", "update_expert_bias", "rotary_tables", "sequence_parallel_layout", "stage_of"]
