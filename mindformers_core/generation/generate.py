"""Batched generation with a static KV cache: one prefill over the (left-padded) prompts, one decode step per
token, each a fixed-shape step so that jit compiles it once.

Rows are left-padded to the longest prompt P; cache slot j holds column j of the padded sequence, so every
row writes the same slots (``cache_slots``), while its rotary positions start at 0 at its first real token
(``position_ids``) and its pad slots are masked out (``kv_valid``): a row's tokens are those it gets alone.
A finished row (EOS) is fed the pad token and its further tokens are dropped; generation stops when every row
is finished or after the new-token budget. The cache has L = P + new tokens slots; each step attends over
all L (masked), so its cost does not grow with the position.

The decode steps run inside one graph, a ``while`` loop (``Generator._loop_fn``): each step's token (the
argmax; with sampling or a repetition penalty ``TokenChooser``, fed the host's uniforms for those steps) is
the next step's input there, and only token ids come back to the host. A decode step is a few milliseconds
of small kernels, so the per-token graph launch, the logits' copy and the host's token choice were a large
part of it (bench/generate.py, docs/generation.md "Measured").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from ..common.graphs import compile_blocking
from ..transformer.kv_cache import CacheStep
from .cache import attach_kv_cache, detach_kv_cache, reattach
from .config import GenerationConfig
from .sampling import TokenChooser, uniform_noise


STREAM_CHUNK = 16      # decode steps per loop call when a streamer wants the tokens as they come
SAMPLE_CHUNK = 16      # decode steps per loop call when sampling (the uniforms of each step are an input)


class CachedStep(nn.Cell):
    """``(input_ids (b, s), position_ids (b, s), cache_slots (s,), kv_valid (b, L)) -> logits (b, s, vocab)`` against
    the model's KV caches of ``max_length`` slots (the generator reads the last column). Every op here is one
    the sharding pass follows, so the step can be parallelized like the model (``Generator(parallel_config=...)``)."""

    def __init__(self, model, max_length: int):
        super().__init__()
        self.model = model
        self.cache_step = CacheStep(model.config, max_length)

    def construct(self, input_ids, position_ids, cache_slots, kv_valid):
        # the mask, the write's scatter and the rotary rows: once per step, for every layer
        mask, scatter, written, cos, sin = self.cache_step(position_ids, cache_slots, kv_valid)
        return self.model.decode(input_ids, None, (scatter, written), (mask, cos, sin), False)


@dataclass
class GenerationResult:
    prompt_ids: List[int]
    new_ids: List[int]
    finish_reason: str                       # "eos" or "length"

    @property
    def token_ids(self) -> List[int]:
        """Prompt + new tokens: what ``transformers``' ``generate`` returns for the row run alone."""
        return list(self.prompt_ids) + list(self.new_ids)


@dataclass
class GenerationStats:
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    step_seconds: List[float] = field(default_factory=list)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def as_dict(self) -> dict:
        return {"prefill_tokens": self.prefill_tokens, "prefill_seconds": round(self.prefill_seconds, 6),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2), "decode_tokens": self.decode_tokens,
                "decode_steps": self.decode_steps, "decode_seconds": round(self.decode_seconds, 6),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 2)}


def check_parallel(config) -> None:
    """Parallel generation shards heads and MLP (tensor parallel) only; the other axes are named."""
    bad = [f"{key} = {getattr(config, key)}" for key, why in (
        ("data_parallel_size", ""), ("pipeline_model_parallel_size", ""), ("context_parallel_size", ""),
        ("expert_model_parallel_size", "")) if (getattr(config, key, 1) or 1) > 1]
    if bad or getattr(config, "sequence_parallel", False):
        bad += ["sequence_parallel = True"] if getattr(config, "sequence_parallel", False) else []
        raise ValueError("parallel generation runs tensor parallel only (heads, MLP and vocabulary split; each rank "
                         f"its KV-cache slice): {', '.join(bad)} is not supported; generate on tp ranks with "
                         "data/pipeline/context/expert parallel sizes 1 (a stage-split or sequence-split KV cache is "
                         "not designed)")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, width: Optional[int] = None):
    """(ids (b, P) int32, position_ids (b, P) int32, first real column per row (b,)); ``P`` is the longest
    prompt, or ``width`` when given (a fixed shape for every batch: a parallel generator keeps one)."""
    lengths = [len(p) for p in prompts]
    width = max(lengths) if width is None else max(max(lengths), int(width))
    ids = np.full((len(prompts), width), pad_id, np.int32)
    positions = np.zeros((len(prompts), width), np.int32)
    starts = np.array([width - n for n in lengths], np.int64)
    for i, p in enumerate(prompts):
        ids[i, starts[i]:] = p
        positions[i, starts[i]:] = np.arange(len(p))
    return ids, positions, starts


class Generator:
    """``Generator(model, config, jit=False).generate(prompts) -> (results, stats)`` for a GPTModel-family model
    on one process. ``max_positions``: the model's maximum sequence (prompt + new tokens), checked first."""

    def __init__(self, model, config: GenerationConfig, jit: bool = False, max_positions: Optional[int] = None,
                 parallel_config=None, decode_loop: bool = True, loop_chunk: Optional[int] = None):
        self.parallel_config = parallel_config     # a TransformerConfig with parallel sizes: shard the step
        if parallel_config is not None:
            check_parallel(parallel_config)
        self.model = model
        self.config = config
        self.jit = bool(jit)
        self.max_positions = max_positions
        self.vocab_size = int(model.config.vocab_size)
        self.chooser = TokenChooser(config, self.vocab_size)
        self.plain_greedy = not config.do_sample and float(config.repetition_penalty) == 1.0
        self.step = None                # a CachedStep, made for each cache shape (prepare)
        self._shape = None
        self._caches = None
        self._compiled = {}
        self._choose = compile_blocking(self._choose_fn) if self.jit else self._choose_fn
        # decode steps in one graph (``_loop_fn``); False: one step (graph) per token, whose logits ``run_step``
        # returns (the tests read them). Tensor parallel keeps one step per token (the loop over a sharded step
        # is not proven)
        self.decode_loop = bool(decode_loop) and parallel_config is None
        # at most this many steps per loop call (None: all that remain; with a streamer STREAM_CHUNK)
        if loop_chunk is not None and int(loop_chunk) < 1:
            raise ValueError(f"Generator: loop_chunk = {loop_chunk}: must be a positive number of steps or None")
        self.loop_chunk = None if loop_chunk is None else int(loop_chunk)

    # the functions jit compiles (plain methods: ms.jit parses their source)
    def _step_fn(self, input_ids, position_ids, cache_slots, kv_valid):
        return self.step(input_ids, position_ids, cache_slots, kv_valid)

    def _choose_fn(self, logits, presence, banned, uniform):
        return self.chooser(logits, presence, banned, uniform)

    def _loop_fn(self, tokens, positions, slot, valid, finished, steps, is_eos, pads, presence, noise):
        """At most ``steps`` decode steps in one graph, from ``tokens`` (b, 1) at ``positions`` (b, 1) and cache
        slot ``slot`` (1,): each step's token is the argmax of its logits, or with sampling or a repetition
        penalty the chooser's (``presence`` (b, V): the rows' tokens so far, updated here as the host does;
        ``noise[j]`` (b, V): the host's uniforms of step j), a finished row's its pad (``pads`` (b,)); a row
        finishes at a token with ``is_eos`` (V,) set, and the loop ends early when every row has finished --
        what the host loop does one step at a time. Returns (tokens (b, L) int32, column j the token of step
        j; the number of steps run)."""
        b, length = valid.shape
        out = ops.zeros((b, length), ms.int32)
        columns = ops.expand_dims(ops.arange(length, dtype=ms.int32), 0)
        vocab = ops.expand_dims(ops.arange(presence.shape[-1], dtype=ms.int32), 0)
        no_ban = ops.zeros_like(presence)
        i = ops.zeros((), ms.int32)
        done = finished
        while ops.logical_and(i < steps, ops.logical_not(ops.all(done))):
            logits = self.step(tokens, positions + i, slot + i, valid)[:, -1, :]
            if self.plain_greedy:
                chosen = ops.cast(ops.argmax(logits, -1), ms.int32)
            else:
                uniform = ops.gather(noise, i, 0) if self.chooser.do_sample else noise[0]
                chosen = self.chooser(logits, presence, no_ban, uniform)[0]
            best = ops.select(done, pads, chosen)
            if not self.plain_greedy:       # the token joins its row's tokens (not a finished row's pad)
                hit = ops.logical_and(vocab == ops.expand_dims(best, 1), ops.expand_dims(ops.logical_not(done), 1))
                presence = ops.select(hit, ops.ones_like(presence), presence)
            done = ops.logical_or(done, ops.gather(is_eos, best, 0) > 0)
            out = ops.select(columns == i, ops.broadcast_to(ops.expand_dims(best, 1), (b, length)), out)
            tokens = ops.expand_dims(best, 1)
            i = i + 1
        return out, i

    def check(self, prompts: Sequence[Sequence[int]], width: Optional[int] = None) -> int:
        """The number of new tokens, after checking the prompts (left-padded to at least ``width``) against the
        model's maximum."""
        if not prompts:
            raise ValueError("generate: no prompt")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"generate: prompt {i} is empty (no token ids)")
            bad = [t for t in p if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise ValueError(f"generate: prompt {i} holds token ids {bad[:5]} outside the vocabulary "
                                 f"[0, {self.vocab_size})")
        width = max(max(len(p) for p in prompts), int(width or 0))
        new = self.config.new_tokens_for(width)
        if self.max_positions is not None:
            if width > self.max_positions:
                longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
                raise ValueError(f"generate: prompt {longest} has {width} tokens, more than the model's maximum "
                                 f"{self.max_positions} (max_position_embeddings): shorten it")
            if width + new > self.max_positions:
                new = self.max_positions - width
        return new

    def prepare(self, batch_size: int, length: int):
        """Caches of ``length`` slots for ``batch_size`` rows on the model (reused when the shape repeats)."""
        if self._shape != (batch_size, length):
            if self.parallel_config is not None and self._shape is not None:
                raise ValueError(f"generate: a parallel generator keeps the shape it was sharded for (batch "
                                 f"{self._shape[0]}, {self._shape[1]} cache slots); got batch {batch_size}, {length} "
                                 "slots: build another Generator")
            self._caches = attach_kv_cache(self.model, batch_size, length)
            self.step = CachedStep(self.model, length)
            self._shape = (batch_size, length)
            self._compiled = {}
            return True
        reattach(self.model, self._caches)
        return False

    def shard(self, ids, positions, valid):
        """Parallelize the step (its model and caches) from the prefill's global shapes; logits replicated."""
        from ..sharding.parallelizer import mesh_layout, parallelize
        base = mesh_layout(self.parallel_config, None)
        parallelize(self.step, self.parallel_config, ids, positions, np.arange(ids.shape[1], dtype=np.int32),
                    valid, output_layouts=[base("None", "None", "None")])

    def _fn(self, name):
        fn = self._loop_fn if name == "loop" else self._step_fn
        if not self.jit:
            return fn
        if name not in self._compiled:
            self._compiled[name] = compile_blocking(fn, cells=[self.model])
        return self._compiled[name]

    def run_loop(self, tokens, positions, slot, valid, finished, steps, is_eos, pad, presence, noise):
        """``_loop_fn`` from NumPy inputs -> (tokens (b, count) int64, count)."""
        b = tokens.shape[0]
        out, count = self._fn("loop")(
            Tensor(tokens.astype(np.int32)[:, None]), Tensor(positions.astype(np.int32)[:, None]),
            Tensor(np.array([slot], np.int32)), Tensor(valid.astype(np.int32)), Tensor(finished.astype(np.bool_)),
            Tensor(np.int32(steps)), Tensor(is_eos), Tensor(np.full((b,), pad, np.int32)), Tensor(presence),
            Tensor(noise))
        count = int(count.asnumpy())
        return out.asnumpy()[:, :count].astype(np.int64), count

    def run_step(self, name, ids, positions, slots, valid):
        return self._fn(name)(Tensor(ids.astype(np.int32)), Tensor(positions.astype(np.int32)),
                              Tensor(slots.astype(np.int32)), Tensor(valid.astype(np.int32)))

    def generate(self, prompts: Sequence[Sequence[int]], streamer: Optional[Callable] = None,
                 width: Optional[int] = None):
        """``streamer(step, tokens, active)``: called after every token with the new ids (b,) and which rows
        were still running; ``width``: left-pad the prompts to at least this many columns (the tokens do not
        change). Returns (list of :class:`GenerationResult`, :class:`GenerationStats`)."""
        cfg = self.config
        prompts = [[int(t) for t in p] for p in prompts]
        new = self.check(prompts, width)
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else (cfg.eos_token_id[0] if cfg.eos_token_id else 0)
        ids, positions, starts = left_pad(prompts, pad, width)
        b, width = ids.shape
        length = width + new
        was_training = self.model.training
        self.model.set_train(False)
        fresh = self.prepare(b, length)
        try:
            if fresh and self.parallel_config is not None:
                valid = (np.arange(length)[None, :] >= starts[:, None]).astype(np.int32)
                self.shard(ids, positions, valid)
            return self._generate(prompts, ids, positions, starts, new, length, streamer)
        finally:
            detach_kv_cache(self.model)
            self.model.set_train(was_training)

    def _generate(self, prompts, ids, positions, starts, new, length, streamer):
        cfg = self.config
        b, width = ids.shape
        valid = (np.arange(length)[None, :] >= starts[:, None]).astype(np.int32)
        presence = np.zeros((b, self.vocab_size), np.float32)
        for i, p in enumerate(prompts):
            presence[i, p] = 1.0
        eos = np.array(cfg.eos_token_id, np.int64)
        no_ban = np.zeros((b, self.vocab_size), np.float32)
        eos_ban = no_ban.copy()
        if eos.size:
            eos_ban[:, eos] = 1.0
        rng = np.random.default_rng(cfg.seed)
        plain_greedy = self.plain_greedy
        is_eos = np.zeros(self.vocab_size, np.int32)
        if eos.size:
            is_eos[eos] = 1
        chunk = self.loop_chunk or (STREAM_CHUNK if streamer is not None else new)
        if cfg.do_sample:
            chunk = min(chunk, SAMPLE_CHUNK)
        loop_noise = np.ones((SAMPLE_CHUNK if cfg.do_sample else 1, b, self.vocab_size), np.float32) / 2
        pending = []                    # tokens the decode loop chose, one (b,) array per step, oldest first
        stats = GenerationStats(prefill_tokens=int(sum(len(p) for p in prompts)))
        t0 = time.perf_counter()
        logits = self.run_step("step", ids, positions, np.arange(width), valid).asnumpy()[:, -1, :]
        stats.prefill_seconds = time.perf_counter() - t0
        new_ids = [[] for _ in range(b)]
        finished = np.zeros(b, bool)
        reasons = ["length"] * b
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else (int(eos[0]) if eos.size else 0)
        lengths = np.array([len(p) for p in prompts], np.int64)
        t_decode = time.perf_counter()
        for t in range(new):
            banned = eos_ban if t < cfg.min_new_tokens else no_ban
            # the uniforms of a step the loop ran were drawn before it, in this order
            noise = uniform_noise(rng, (b, self.vocab_size)) if cfg.do_sample and not pending else no_ban
            if pending:
                tokens = pending.pop(0)
            elif plain_greedy and t >= cfg.min_new_tokens:
                tokens = logits.argmax(-1).astype(np.int64)          # the argmax: no graph launch needed
            else:
                tokens, _ = self._choose(Tensor(logits), Tensor(presence), Tensor(banned), Tensor(noise))
                tokens = tokens.asnumpy().astype(np.int64)
            active = ~finished
            tokens = np.where(active, tokens, pad)
            for i in np.nonzero(active)[0]:
                new_ids[i].append(int(tokens[i]))
                presence[i, tokens[i]] = 1.0
                if eos.size and tokens[i] in eos:
                    finished[i] = True
                    reasons[i] = "eos"
            if t > 0:
                stats.decode_tokens += int(active.sum())
            if streamer is not None:
                streamer(t, tokens, active)
            if finished.all() or t == new - 1:
                break
            if pending:
                continue
            if self.decode_loop and t + 1 >= cfg.min_new_tokens:
                # the next steps inside one graph (no EOS ban from token t + 1 on)
                s0 = time.perf_counter()
                steps = min(chunk, new - 1 - t)
                if cfg.do_sample:
                    loop_noise[:steps] = uniform_noise(rng, (steps, b, self.vocab_size))
                out, count = self.run_loop(tokens, lengths + t, width + t, valid, finished, steps, is_eos, pad,
                                           presence, loop_noise)
                per_step = (time.perf_counter() - s0) / max(count, 1)
                pending = [out[:, j] for j in range(count)]
                stats.step_seconds.extend([per_step] * count)
                stats.decode_steps += count
                continue
            s0 = time.perf_counter()
            logits = self.run_step("step", tokens[:, None], (lengths + t)[:, None], np.array([width + t]),
                                   valid).asnumpy()[:, -1, :]
            stats.step_seconds.append(time.perf_counter() - s0)
            stats.decode_steps += 1
        stats.decode_seconds = time.perf_counter() - t_decode
        results = [GenerationResult(prompts[i], new_ids[i], reasons[i]) for i in range(b)]
        return results, stats
