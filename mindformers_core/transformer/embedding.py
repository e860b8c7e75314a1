"""Word embeddings: a table lookup that declares a vocabulary split over ``tp``.

``VocabParallelEmbedding`` is one ``embedding`` op for the sharding pass, which runs the
vocab-parallel lookup (local ids in range, zeros elsewhere, summed over tp) on the shards.
``LanguageModelEmbedding`` is the model's input stage: lookup, cast, optional dropout. Rotary
positions are applied inside attention, so there is no learned position table.
"""
from __future__ import annotations

from mindspore import nn, ops

from .config import TransformerConfig
from .init import normal_parameter
from .linear import sequence_parallel_layout


class VocabParallelEmbedding(nn.Cell):
    """``weight[input_ids]`` with weight ``(num_embeddings, embedding_dim)``."""
    sharding_op = "embedding"
    sharding_params = ("weight",)
    normal_init_params = ("weight",)

    def __init__(self, num_embeddings: int, embedding_dim: int, config: TransformerConfig):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = normal_parameter(f"{type(self).__name__}:{num_embeddings}x{embedding_dim}",
                                       (num_embeddings, embedding_dim), config.init_method_std,
                                       config.ms_params_dtype, "weight")

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config: TransformerConfig):
        return None, sequence_parallel_layout(config), {"weight": config.layout("tp", "None")}

    def construct(self, input_ids):
        return ops.gather(self.weight, input_ids, 0)


class LanguageModelEmbedding(nn.Cell):
    """ids (b, s) -> hidden states (b, s, h) in the compute dtype."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size, config)
        self.compute_dtype = config.ms_compute_dtype
        self.need_cast = config.params_dtype != config.compute_dtype
        self.dropout_p = config.hidden_dropout
        self.use_dropout = config.hidden_dropout > 0

    def construct(self, input_ids):
        x = self.word_embeddings(input_ids)
        if self.need_cast:
            x = ops.cast(x, self.compute_dtype)
        if self.use_dropout:
            x = ops.dropout(x, p=self.dropout_p, training=self.training)
        return x
