"""GPTModel: embedding -> TransformerBlock -> output layer -> loss, on one card.

With pipeline parallelism a stage builds a GPTModel for its own part: ``pre_process`` (the
embedding, ids in) only on the first stage, ``post_process`` (final norm, output layer, loss)
only on the last; by default both follow from the stage. Tied embeddings reuse the embedding
table as the output weight (``logits = h @ E^T``). With
``mtp_num_layers`` the multi-token prediction depths (``mtp.py``) follow the final norm and add their term to
the loss, through this model's embedding and head. A last pipeline stage (no ``pre_process``) whose tied output
layer or MTP depths read the embedding table holds a copy of it (``embedding_copy``), built under the same name
(so drawn and loaded identically, as Megatron copies a tied embedding to its last stage): the tied output layer
multiplies by it, the MTP depths look the microbatch's ids up in it (``token_ids``); the pipeline keeps the two
copies equal by summing their gradients (``pipeline/runtime.py``, ``tied``), and checkpoints save the first
stage's.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn, ops

from ..common.batch import BATCH_KEYS  # noqa: F401 (the argument order of construct)
from .block import TransformerBlock, stage_of
from .config import TransformerConfig
from .embedding import LanguageModelEmbedding
from .init import init_weights
from .layer import gpt_layer_spec
from .linear import ColumnParallelLinear
from .loss import MaskedMean, VocabParallelCrossEntropy
from .mtp import MultiTokenPrediction, SharedOutputHead


class TiedOutputLayer(nn.Cell):
    """``x @ weight^T`` with the (vocab, hidden) embedding table passed in: one ``matmul`` op
    (``transpose_b=True``) whose second input is the embedding weight, so a vocab-split table
    gives vocab-split logits. It owns no weight: hsdp level3 gathers the table it is handed around its calls
    (``PARAMETER_ARGUMENTS_ATTR``)."""
    sharding_op = "matmul"
    sharding_params = ()
    mfc_parameter_arguments = True      # (sharding.annotations.PARAMETER_ARGUMENTS_ATTR)

    def sharding_attrs(self) -> dict:
        return {"transpose_b": True}

    def shard(self, config):
        return None, None, None

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.compute_dtype = config.ms_compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x, weight):
        x2 = ops.cast(x.reshape(-1, x.shape[-1]), self.compute_dtype)
        out = self.matmul(x2, ops.cast(weight, self.compute_dtype))
        return out.reshape(x.shape[:-1] + (-1,))


class StageTiedOutputLayer(SharedOutputHead):
    """The tied output layer of a last pipeline stage: ``x @ weight^T``, ``weight`` the stage's copy of the
    embedding table (the same Parameter object, held here). The stage does not look ids up in its copy (unless
    MTP does), so this Cell declares the table's layout, the embedding's own (vocab split over tp): the two
    copies are sharded alike and their gradients add up piece by piece."""

    def __init__(self, config: TransformerConfig, weight):
        super().__init__(config, weight, tied=True)

    def shard(self, config):
        return None, None, {"weight": config.layout("tp", "None")}


class GPTModel(nn.Cell):
    """``construct(input_ids, labels=None, loss_mask=None, position_ids=None, segment_ids=None)`` --
    the arguments are the batch's keys, in :data:`BATCH_KEYS` order: the mean loss when labels are
    given (over the tokens ``loss_mask`` keeps, all by default), else logits (b, s, vocab).
    ``position_ids`` / ``segment_ids`` (b, s): each token's position and document (packed rows; see
    ``SelfAttention``). Without ``pre_process`` the first argument is hidden states (b, s, h); without
    ``post_process`` the result is hidden states, or (hidden states, load-balancing loss of this part's
    MoE layers) when it holds any (``returns_aux``). ``token_ids``: the ids of the microbatch on a last
    pipeline stage with multi-token prediction (its first argument being hidden states). ``layer_spec``: a LayerSpec or a spec function
    ``(config, layer_number) -> LayerSpec`` (``transformer/spec.py``; default :func:`gpt_layer_spec`).

    The sequence length s of ``input_ids`` may be anything up to ``config.max_positions`` (max_position_embeddings,
    at least seq_length; past it: a ``ValueError``), not only ``seq_length``: the rotary rows and the causal mask
    follow s. Under ``ms.jit`` every new length is a new compile. With context parallelism s must be
    ``seq_length`` (the storage order of the sequence is built for it)."""

    def __init__(self, config: TransformerConfig, pre_process: Optional[bool] = None,
                 post_process: Optional[bool] = None, layer_spec=gpt_layer_spec, pp_rank: int = 0,
                 vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None):
        super().__init__()
        self.config = config
        self.max_positions = config.max_positions
        stage = stage_of(config, pp_rank, vp_stage, layers_per_stage)
        self.pre_process = stage.has_embedding if pre_process is None else pre_process
        self.post_process = stage.has_output if post_process is None else post_process
        self.tie = config.tie_word_embeddings
        std = config.init_method_std
        if self.pre_process:
            self.embedding = LanguageModelEmbedding(config)
            init_weights(self.embedding, "embedding", std)
        self.decoder = TransformerBlock(config, layer_spec, pp_rank, vp_stage, layers_per_stage,
                                        post_layer_norm=self.post_process)
        # multi-token prediction (mtp.py): its depths after the final norm (the last stage of a pipeline), sharing
        # the embedding and the head. A last stage without the embedding whose tied output layer or MTP depths
        # read the table holds a copy of it (module docstring); ``token_ids``: the MTP depths look ids up in it
        self.has_mtp = config.mtp_depths > 0 and self.post_process
        self.embedding_copy = self.post_process and not self.pre_process and (self.has_mtp or self.tie)
        self.takes_token_ids = self.has_mtp and not self.pre_process
        if self.embedding_copy:
            self.embedding = LanguageModelEmbedding(config)
            init_weights(self.embedding, "embedding", std)
        if self.post_process:
            if self.tie and self.embedding_copy:
                table = self.embedding.word_embeddings.weight
                name = table.name
                self.output_layer = StageTiedOutputLayer(config, table)
                table.name = name   # its owner's name (MindSpore renames a Parameter a new sub-Cell holds)
            elif self.tie:
                self.output_layer = TiedOutputLayer(config)
            else:
                self.output_layer = ColumnParallelLinear(config.hidden_size, config.vocab_size, config, bias=False)
                init_weights(self.output_layer, "output_layer", std)
            self.loss = VocabParallelCrossEntropy()
            self.token_loss = VocabParallelCrossEntropy(reduction="none")
            self.masked_mean = MaskedMean()
        if self.has_mtp:
            head = self.embedding.word_embeddings.weight if self.tie else self.output_layer.weight
            name = head.name
            self.mtp = MultiTokenPrediction(config, layer_spec, head)
            self.mtp.global_names()
            head.name = name        # its owner's name (MindSpore renames a Parameter that a new sub-Cell holds)
        # MoE: the load-balancing loss joins the loss; a pipeline stage without the output layer returns
        # (hidden states, its layers' load-balancing loss), a stage-local loss term (pipeline/runtime.py)
        self.returns_aux = self.decoder.returns_aux

    def construct(self, input_ids, labels=None, loss_mask=None, position_ids=None, segment_ids=None,
                  token_ids=None):
        self.check_length(input_ids.shape[1])
        if self.pre_process:
            x = self.embedding(input_ids)
        else:
            x = input_ids
        embedded = x
        if self.takes_token_ids and labels is not None:   # the last pipeline stage: the MTP depths' embedding
            embedded = self.embedding(token_ids)
        if self.returns_aux:
            decoded = self.decoder(x, position_ids, segment_ids)
            if not self.post_process:
                return decoded
            x, aux = decoded
            loss = self._head(x, labels, loss_mask)
            if labels is None:
                return loss
            if self.has_mtp:
                loss = loss + self._mtp(x, embedded, labels, loss_mask, position_ids, segment_ids)
            return loss + aux
        x = self.decoder(x, position_ids, segment_ids)
        if not self.post_process:
            return x
        loss = self._head(x, labels, loss_mask)
        if self.has_mtp and labels is not None:
            return loss + self._mtp(x, embedded, labels, loss_mask, position_ids, segment_ids)
        return loss

    def check_length(self, s: int):
        """A ``ValueError`` for a sequence of s tokens past ``config.max_positions`` (s is static: under ``ms.jit``
        it is raised while compiling)."""
        if s > self.max_positions:
            raise ValueError(f"GPTModel: input_ids has {s} tokens, past the model's position limit "
                             f"max_positions={self.max_positions} (max_position_embeddings, at least seq_length)")

    def _mtp(self, hidden, embedded, labels, loss_mask, position_ids, segment_ids):
        """The multi-token prediction term (with its layers' load-balancing losses): depth k takes this model's
        embedding output shifted by k, runs its layer on the previous depth's hidden states, and is scored with
        this model's head weight (its own head Cell) against the labels shifted by k."""
        mtp = self.mtp
        losses, aux = (), ()
        for layer in mtp.layers:
            if mtp.returns_aux:
                hidden, loss_k, a = layer(hidden, embedded, labels, loss_mask, position_ids, segment_ids)
                aux = aux + (a,)
            else:
                hidden, loss_k = layer(hidden, embedded, labels, loss_mask, position_ids, segment_ids)
            losses = losses + (loss_k,)
        total = losses[0]
        for loss_k in losses[1:]:
            total = total + loss_k
        term = mtp.total(total)
        for a in aux:
            term = term + a
        return term

    def decode(self, input_ids, position_ids, cache_slots, kv_mask, last_only=False):
        """Generation against the KV caches attached to the attention layers (``generation.cache``): logits
        (b, s, vocab) of ``input_ids`` (b, s); ``cache_slots`` = the step's ``(scatter, written)`` and
        ``kv_mask`` = its ``(mask, cos, sin)`` (``kv_cache.CacheStep``, once per step: the slots written, the
        mask (b, 1, s, L), the rotary rows of the positions); ``position_ids`` is passed on unread by the
        cached attention; ``last_only``: the logits of the last column only, (b, 1, vocab). Needs the whole
        model (no pipeline stage)."""
        x = self.embedding(input_ids)
        x = self.decoder(x, position_ids, None, cache_slots, kv_mask)
        if self.returns_aux:
            x = x[0]
        if last_only and x.shape[1] > 1:
            x = x[:, -1:, :]
        return self._head(x, None, None)

    def _logits(self, x):
        if self.tie and not self.embedding_copy:
            return self.output_layer(x, self.embedding.word_embeddings.weight)
        return self.output_layer(x)

    def _head(self, x, labels, loss_mask):
        """Logits, or the loss: the mean over every token, or over the tokens ``loss_mask`` keeps."""
        logits = self._logits(x)
        if labels is None:
            return logits
        if loss_mask is None:
            return self.loss(logits, labels)
        return self.masked_mean(self.token_loss(logits, labels), loss_mask)
