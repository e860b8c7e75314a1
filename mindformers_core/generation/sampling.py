"""The next token from the logits, as Hugging Face defines it (``transformers.generation.logits_process``).

``TokenChooser`` is one Cell (PyNative or one jit graph): the repetition penalty (a logit of a token already
in the row, prompt included, is divided by the penalty when positive and multiplied when negative), the
tokens banned this step (``min_new_tokens``: EOS set to -inf), then with ``do_sample`` the temperature
(``scores / t``), top-k (``scores < k-th largest`` -> -inf) and top-p (sort ascending, cumulative softmax,
drop what sums to at most 1 - p, always keep the largest) in transformers' order; greedy is the argmax of
the penalized scores. Sampling draws from softmax(scores) by the Gumbel-max trick with the noise given as
an input (uniforms from a seeded NumPy generator on the host): the same seed gives the same tokens in
PyNative and under jit, and the distribution is the multinomial's.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from .config import GenerationConfig

NEG_INF = float("-inf")


class TokenChooser(nn.Cell):
    """``(logits (b, V), presence (b, V) 0/1, banned (b, V) 0/1, uniform (b, V) in (0, 1)) -> (next ids (b,)
    int32, processed scores (b, V))``. ``presence``: the tokens already in each row (repetition penalty);
    ``banned``: tokens forbidden this step; ``uniform`` is read only with ``do_sample``."""

    def __init__(self, config: GenerationConfig, vocab_size: int):
        super().__init__()
        self.penalty = float(config.repetition_penalty)
        self.use_penalty = self.penalty != 1.0
        self.do_sample = bool(config.do_sample)
        self.temperature = float(config.temperature)
        self.top_k = min(int(config.top_k or 0), vocab_size)
        self.top_p = float(config.top_p)

    def construct(self, logits, presence, banned, uniform):
        scores = ops.cast(logits, ms.float32)
        neg_inf = ops.fill(ms.float32, scores.shape, NEG_INF)
        if self.use_penalty:
            penalized = ops.select(scores < 0, scores * self.penalty, scores / self.penalty)
            scores = ops.select(presence > 0.5, penalized, scores)
        scores = ops.select(banned > 0.5, neg_inf, scores)
        if self.do_sample:
            if self.temperature != 1.0:
                scores = scores / self.temperature
            if self.top_k > 0:
                kth = ops.topk(scores, self.top_k)[0][:, self.top_k - 1:self.top_k]
                scores = ops.select(scores < kth, neg_inf, scores)
            if self.top_p < 1.0:
                sorted_scores, order = ops.sort(scores, -1, False)
                cumulative = ops.cumsum(ops.softmax(sorted_scores, -1), -1)
                remove = cumulative <= (1.0 - self.top_p)
                keep_last = ops.arange(scores.shape[-1], dtype=ms.int32) == scores.shape[-1] - 1
                remove = ops.logical_and(remove, ops.logical_not(ops.expand_dims(keep_last, 0)))
                inverse = ops.argsort(ops.cast(order, ms.float32), -1)
                remove = ops.gather_elements(ops.cast(remove, ms.int32), 1, ops.cast(inverse, ms.int32)) > 0
                scores = ops.select(remove, neg_inf, scores)
            gumbel = -ops.log(-ops.log(uniform))
            tokens = ops.argmax(scores + gumbel, -1)
        else:
            tokens = ops.argmax(scores, -1)
        return ops.cast(tokens, ms.int32), scores


def uniform_noise(rng: np.random.Generator, shape) -> np.ndarray:
    """Uniforms in the open interval (0, 1), float32, for the Gumbel-max draw."""
    u = rng.random(shape, dtype=np.float64)
    return np.clip(u, 1e-12, 1.0 - 1e-7).astype(np.float32)
