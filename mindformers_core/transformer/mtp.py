"""Multi-token prediction (MTP, DeepSeek-V3): extra depths after the main model that predict tokens further ahead.

Depth k (1-based) takes the hidden states of depth k-1 (depth 0: the main model's, after its final norm) and the
embedding of the tokens shifted by k, and predicts token t+k+1 at position t::

    h_k = shared_head_norm(layer_k(eh_proj(concat[enorm(emb(ids[t+k])), hnorm(h_{k-1})])))
    loss_k = masked mean of CE(head(h_k), labels[t+k]) over loss_mask[t+k], positions t+k past the end dropped

The embedding and the output head are the main model's (shared, not copied); ``enorm``/``hnorm``/``eh_proj``/the
transformer layer/``shared_head_norm`` are the depth's own, named by the layer's global index as DeepSeek's
checkpoints number them: depth k of a model of L layers is ``mtp.layers.<L + k - 1>`` (``model.layers.<L + k - 1>``
in Hugging Face names, ``models/mtp_names.py``); ``mtp.layers`` holds empty placeholders below L. The concatenation puts the embedding first, as
DeepSeek's released checkpoints and Megatron-core order it. ``layer_k`` is built from the model's own layer spec
for its last layer (DeepSeek-V3's MTP layer is a MoE layer like its last one). The term added to the loss is
``mtp_loss_scaling_factor / depths * sum_k loss_k`` (Megatron-core's and MindFormers': the factor times the mean
over depths). The shift is a ``gather`` along the sequence with a constant index, so the sharding pass follows
it (batch split over dp is untouched; the sequence must be whole on a rank: no context parallelism).
"""
from __future__ import annotations

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


def shifted_index(seq_length: int, k: int) -> np.ndarray:
    """Position t -> t + k, clamped to the last position (those targets are masked out)."""
    return np.minimum(np.arange(seq_length) + k, seq_length - 1).astype(np.int32)


class MultiTokenPredictionLayer(nn.Cell):
    """Depth ``depth`` (1-based): ``(h_{k-1}, embedding of the shifted ids) -> h_k`` (b, s, h). Its weights are
    drawn under its name, ``mtp.layers.<num_layers + depth - 1>``."""

    def __init__(self, config: TransformerConfig, depth: int, layer_spec: LayerSpecLike):
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
        init_weights(self, f"mtp.layers.{config.num_layers + depth - 1}", config.init_method_std)
        s = config.seq_length
        self.shift_index = Tensor(shifted_index(s, depth))      # the constants of this depth's shift
        self.in_range = Tensor((np.arange(s) + depth < s).astype(np.float32)[None])   # (1, s): t + depth < s

    def construct(self, hidden, embedded, position_ids=None, segment_ids=None):
        x = self.eh_proj(ops.concat((self.enorm(embedded), self.hnorm(hidden)), -1))
        if self.returns_aux:
            x, aux = self.transformer_layer(x, position_ids, segment_ids)
            return self.shared_head_norm(x), aux
        return self.shared_head_norm(self.transformer_layer(x, position_ids, segment_ids))


class MultiTokenPrediction(nn.Cell):
    """The MTP depths and their loss, driven by the model that owns the embedding and the output head
    (``GPTModel._mtp``): per depth k, ``shifted_ids`` -> the model's embedding -> ``layers[first + k - 1]`` -> the
    model's head
    -> :meth:`depth_loss`; :meth:`total` scales the sum and records it for the log. The embedding and head are
    called by the model, never held here, so their parameters stay the main model's own."""

    def __init__(self, config: TransformerConfig, layer_spec: LayerSpecLike):
        super().__init__()
        self.depths = config.mtp_depths
        self.first = config.num_layers          # depth k is layers[first + k - 1]: its global layer index
        self.layers = nn.CellList([nn.Cell() for _ in range(self.first)]
                                  + [MultiTokenPredictionLayer(config, k, layer_spec) for k in range(1, self.depths + 1)])
        self.returns_aux = self.layers[self.first].returns_aux
        self.scale = float(config.mtp_loss_scaling_factor) / self.depths
        self.token_loss = VocabParallelCrossEntropy(reduction="none")
        self.masked_mean = MaskedMean()
        self.probe = MTPLossProbe()

    def shifted(self, x, layer):
        """``x`` (b, s) at positions t + depth (clamped at the end)."""
        return ops.gather(x, layer.shift_index, 1)

    def depth_loss(self, logits, labels, loss_mask, layer):
        """The masked mean CE of one depth: targets ``labels[t + depth]`` under ``loss_mask[t + depth]``; the last
        ``depth`` positions (no target inside the sequence) are dropped."""
        token_loss = self.token_loss(logits, self.shifted(labels, layer))
        if loss_mask is None:
            mask = token_loss * 0.0 + layer.in_range
        else:
            mask = self.shifted(ops.cast(loss_mask, ms.float32), layer) * layer.in_range
        return self.masked_mean(token_loss, mask)

    def total(self, depth_losses_sum):
        """``mtp_loss_scaling_factor / depths x sum_k loss_k``, recorded for the per-step log."""
        return self.probe(depth_losses_sum * self.scale)

    def construct(self, *args):
        raise RuntimeError("MultiTokenPrediction is driven by its model (GPTModel), which owns the shared "
                           "embedding and output head; it is not called on its own")
