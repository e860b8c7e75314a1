"""Multi-token prediction (MTP, DeepSeek-V3): extra depths after the main model that predict tokens further ahead.

Depth k (1-based) takes the hidden states of depth k-1 (depth 0: the main model's, after its final norm) and the
embedding of the tokens shifted by k, and predicts token t+k+1 at position t::

    h_k = shared_head_norm(layer_k(eh_proj(concat[enorm(emb[t+k]), hnorm(h_{k-1})])))
    loss_k = masked mean of CE(head(h_k), labels[t+k]) over loss_mask[t+k], positions t+k past the end dropped

The embedding and the output head are the main model's (shared, not copied): ``emb[t+k]`` is the main model's
embedding output at position t+k (the ids there, looked up once; on a pipeline's last stage, which has no embedding,
the lookup of the microbatch's ids in the stage's copy of the table: ``GPTModel``, ``token_ids``), and each depth's ``head`` is its own Cell holding
the main head's weight Parameter (the same object: one Cell per call site, as the sharding pass wants, and every
use of the weight inside an op, so its gradient is summed like any shared parameter's). ``enorm``, ``hnorm``,
``eh_proj``, the transformer layer and ``shared_head_norm`` are the depth's own, their parameters named by the
layer's global index as DeepSeek's checkpoints number them: depth k of a model of L layers is
``mtp.layers.<L + k - 1>`` (``model.layers.<L + k - 1>`` in Hugging Face names, ``models/mtp_names.py``). The
concatenation puts the embedding first, as DeepSeek's released checkpoints and Megatron-core order it.
``layer_k`` is built from the model's own layer spec for its last layer (DeepSeek-V3's MTP layer is a MoE layer
like its last one). The term added to the loss is
``mtp_loss_scaling_factor / depths * sum_k loss_k`` (Megatron-core's and MindFormers': the factor times the mean
over depths). The shift is a ``gather`` along the sequence with a constant index, so the sharding pass follows
it (batch split over dp is untouched; with sequence or context parallelism the pass gathers the sequence for it
and splits the result again). Under load-balanced context parallelism the sequence is held in storage order
(``common/sequence_placement.py``): the index maps each slot to the slot of the token k places later, and the
positions past the end are those whose token, not slot, is among the last k.
"""
from __future__ import annotations

import re

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from .config import TransformerConfig
from .init import init_weights
from .layer import TransformerLayer
from .linear import ColumnParallelLinear
from .loss import MaskedMean, VocabParallelCrossEntropy
from .norm import build_norm
from .spec import LayerSpecLike, spec_for_layer


class MTPLossProbe(nn.Cell):
    """Identity on the MTP loss term that adds its value to ``loss_sum`` (and 1 to ``forwards``) for the per-step
    log (``training/mtp_log.py``); one ``identity`` op for the sharding pass, like the MoE ``AuxLossProbe``."""
    sharding_op = "identity"
    sharding_params = ()

    def __init__(self):
        super().__init__()
        self.loss_sum = Parameter(Tensor(np.zeros((), np.float32)), name="mtp_loss_sum", requires_grad=False)
        self.forwards = Parameter(Tensor(np.zeros((), np.float32)), name="mtp_forwards", requires_grad=False)

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, x):
        x = ops.depend(x, ops.assign_add(self.loss_sum, ops.stop_gradient(x).reshape(()).astype(ms.float32)))
        return ops.depend(x, ops.assign_add(self.forwards, ops.ones((), ms.float32)))


class SharedOutputHead(nn.Cell):
    """``x @ weight`` (untied head, weight (hidden, vocab)) or ``x @ weight^T`` (tied: the embedding table
    (vocab, hidden)), ``weight`` being the main model's Parameter (the same object, not a copy): one ``matmul``
    op whose weight keeps the layout its owner declares, so a vocab-split weight gives vocab-split logits."""
    sharding_op = "matmul"
    sharding_params = ("weight",)

    def __init__(self, config: TransformerConfig, weight: Parameter, tied: bool):
        super().__init__()
        self.tied = tied
        self.compute_dtype = config.ms_compute_dtype
        self.matmul = ops.MatMul(transpose_b=tied)
        self.weight = weight

    def sharding_attrs(self) -> dict:
        return {"transpose_b": self.tied}

    def shard(self, config):
        return None, None, None

    def construct(self, x):
        x2 = ops.cast(x.reshape(-1, x.shape[-1]), self.compute_dtype)
        out = self.matmul(x2, ops.cast(self.weight, self.compute_dtype))
        return out.reshape(x.shape[:-1] + (-1,))


def shifted_index(seq_length: int, k: int, positions=None) -> np.ndarray:
    """Slot j -> the slot holding the token k places after slot j's (position t -> t + k, clamped to the last
    position: those targets are masked out). ``positions``: the token position each slot holds (the sequence's
    storage order under load-balanced context parallelism, ``TransformerConfig.token_positions``); None: the
    identity."""
    if positions is None:
        return np.minimum(np.arange(seq_length) + k, seq_length - 1).astype(np.int32)
    positions = np.asarray(positions, np.int64)
    slot_of = np.empty(seq_length, np.int64)
    slot_of[positions] = np.arange(seq_length)
    return slot_of[np.minimum(positions + k, seq_length - 1)].astype(np.int32)


class MultiTokenPredictionLayer(nn.Cell):
    """Depth ``depth`` (1-based): ``(h_{k-1}, embedding of the shifted ids) -> h_k`` (b, s, h). Its weights are
    drawn under its name, ``mtp.layers.<num_layers + depth - 1>``."""

    def __init__(self, config: TransformerConfig, depth: int, layer_spec: LayerSpecLike, head_weight: Parameter):
        super().__init__()
        h = config.hidden_size
        self.depth = depth
        self.enorm = build_norm(h, config)
        self.hnorm = build_norm(h, config)
        self.eh_proj = ColumnParallelLinear(2 * h, h, config, bias=False)
        spec = spec_for_layer(layer_spec, config, config.num_layers)
        self.transformer_layer = TransformerLayer(config, config.num_layers, spec)
        self.returns_aux = self.transformer_layer.returns_aux
        self.shared_head_norm = build_norm(h, config)
        self.head = SharedOutputHead(config, head_weight, config.tie_word_embeddings)
        self.token_loss = VocabParallelCrossEntropy(reduction="none")      # this depth's own loss Cells
        self.masked_mean = MaskedMean()
        init_weights(self, f"mtp.layers.{config.num_layers + depth - 1}", config.init_method_std)
        s = config.seq_length
        positions = np.asarray(config.token_positions())        # each slot's token (cp: storage order)
        self.shift_index = Tensor(shifted_index(s, depth, positions))    # the constants of this depth's shift
        self.in_range = Tensor((positions + depth < s).astype(np.float32)[None])   # (1, s): t + depth < s

    def construct(self, hidden, embedded, labels, loss_mask=None, position_ids=None, segment_ids=None):
        """``(h_k, loss_k)`` (and the layer's load-balancing loss when it has one) from the previous depth's hidden
        states and the main model's embedding output (both (b, s, h), unshifted): the depth's masked mean CE of
        targets ``labels[t + depth]`` under ``loss_mask[t + depth]``, the last ``depth`` positions dropped."""
        shifted = ops.gather(embedded, self.shift_index, 1)
        x = self.eh_proj(ops.concat((self.enorm(shifted), self.hnorm(hidden)), -1))
        if self.returns_aux:
            x, aux = self.transformer_layer(x, position_ids, segment_ids)
        else:
            x = self.transformer_layer(x, position_ids, segment_ids)
        x = self.shared_head_norm(x)
        token_loss = self.token_loss(self.head(x), ops.gather(labels, self.shift_index, 1))
        if loss_mask is None:
            mask = token_loss * 0.0 + self.in_range
        else:
            mask = ops.cast(ops.gather(loss_mask, self.shift_index, 1), ms.float32) * self.in_range
        loss = self.masked_mean(token_loss, mask)
        if self.returns_aux:
            return x, loss, aux
        return x, loss


class MultiTokenPrediction(nn.Cell):
    """The MTP depths (``layers``) and the term they add: ``factor / depths x sum_k loss_k`` (:meth:`total`,
    recorded for the log). Driven by the model that owns the embedding and the head (``GPTModel._mtp``): each
    depth gets that model's embedding output and holds its head weight. Parameter names carry the global layer
    index (``mtp.layers.<num_layers + k - 1>``, set by the model once it holds this Cell: :meth:`global_names`)."""

    def __init__(self, config: TransformerConfig, layer_spec: LayerSpecLike, head_weight: Parameter):
        super().__init__()
        self.depths = config.mtp_depths
        self.first = config.num_layers
        self.layers = nn.CellList([MultiTokenPredictionLayer(config, k, layer_spec, head_weight)
                                   for k in range(1, self.depths + 1)])
        self.returns_aux = self.layers[0].returns_aux
        self.scale = float(config.mtp_loss_scaling_factor) / self.depths
        self.probe = MTPLossProbe()

    def global_names(self, owner_prefix: str = "mtp.") -> None:
        """``mtp.layers.<k>.`` -> ``mtp.layers.<num_layers + k>.`` in this Cell's parameter names (DeepSeek's
        numbering: the MTP layer after L layers is layer L), as a pipeline stage's layers get global numbers."""
        own = re.compile(re.escape(owner_prefix) + r"layers\.(\d+)\.")
        for p in self.get_parameters():
            p.name = own.sub(lambda m: f"{owner_prefix}layers.{self.first + int(m.group(1))}.", p.name, count=1)

    def total(self, depth_losses_sum):
        """``mtp_loss_scaling_factor / depths x sum_k loss_k``, recorded for the per-step log."""
        return self.probe(depth_losses_sum * self.scale)

    def construct(self, *args):
        raise RuntimeError("MultiTokenPrediction is driven by its model (GPTModel), which owns the shared "
                           "embedding and output head; it is not called on its own")
