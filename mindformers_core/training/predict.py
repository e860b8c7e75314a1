"""``run_mode: predict``: batched generation with a KV cache (``mindformers_core.generation``) from the loaded
weights, on one process or tensor parallel under msrun (``parallel_config.model_parallel`` = the worker count:
each rank its heads, MLP and vocabulary slices and its KV-cache slice; rank 0 prints and writes the results).

Prompts: ``--predict_data`` strings, or one file: ``.jsonl`` (one JSON object a line: ``{"prompt": text}``,
``{"text": text}`` or ``{"messages": [{role, content}, ...]}`` rendered with the model folder's chat
template), any other file one prompt per line. ``--predict_batch_size`` prompts of different lengths run as
one left-padded batch. What to generate: the model folder's ``generation_config.json``, overridden by the
YAML's ``model.model_config`` generation keys (MindFormers': ``do_sample``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``, ``max_decode_length``, ``max_new_tokens``, ``min_new_tokens``, ``eos_token_id``,
``pad_token_id``), overridden by the flags (``--max_new_tokens``, ``--do_sample``, ``--temperature``, ``--top_k``,
``--top_p``, ``--repetition_penalty``, ``--min_new_tokens``, ``--max_length``); a source that sets a length limit
replaces the earlier ones'; the seed is the config's ``seed``.
Output: the text streamed to the console for one-prompt batches (each text printed when its batch ends
otherwise), ``predict_results.jsonl`` in the output directory (prompt, text, token ids, new ids, finish
reason), and prefill / decode tokens per second.
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence

from ..generation import GenerationConfig, Generator
from ..generation.config import ALIASES, defaults, value_problems

# MindFormers' generation keys of model.model_config (schema keys; the model ignores them)
YAML_KEYS = ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty", "max_decode_length",
             "max_new_tokens", "min_new_tokens", "eos_token_id", "pad_token_id")
RESULTS = "predict_results.jsonl"


def read_prompts(predict_data: Optional[Sequence[str]]) -> List[Any]:
    """Prompts as strings, or message lists (chat) from a JSONL file. ``ValueError`` naming the line."""
    data = list(predict_data or ["Return the"])
    if len(data) == 1 and os.path.isfile(data[0]):
        path = data[0]
        if path.endswith(".jsonl"):
            from ..data.hf_dataset import json_lines
            try:
                rows = json_lines(path)
            except ValueError as e:
                raise ValueError(f"--predict_data {e}") from None
            prompts = []
            for no, row in rows:
                if isinstance(row, dict) and isinstance(row.get("messages"), list):
                    prompts.append(row["messages"])
                elif isinstance(row, dict) and isinstance(row.get("prompt", row.get("text")), str):
                    prompts.append(row.get("prompt", row.get("text")))
                else:
                    raise ValueError(f"--predict_data {path}:{no}: needs a 'prompt' (or 'text') string or a "
                                     "'messages' list")
            return prompts
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
        return [line.replace("\\n", "\n") for line in lines if line.strip()]
    return [p.replace("\\n", "\n") for p in data]


def encode_prompt(tokenizer, prompt) -> List[int]:
    """Token ids of a prompt: BOS (when the tokenizer has one) + the text, or a chat rendered with the
    tokenizer's chat template (with the generation prompt)."""
    if isinstance(prompt, list):
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError("--predict_data: chat messages need the model folder's chat template "
                             "(chat_template.jinja or tokenizer_config.json's chat_template); the tokenizer has none")
        from ..data.handlers import chat_renderer
        text = chat_renderer(template, tokenizer, "--predict_data")(prompt, add_generation_prompt=True)
        return tokenizer.encode(text, add_bos=False)
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]     # Qwen's tokenizers have none
    return bos + tokenizer.encode(prompt, add_bos=False)


def generation_config(tokenizer, folder_generation: Optional[Dict[str, Any]], model_config: Dict[str, Any],
                      flags: Dict[str, Any], seed: int = 0) -> GenerationConfig:
    """generation_config.json, then the YAML's generation keys, then the flags; EOS/pad ids default to the
    tokenizer's. Limits default to 32 new tokens (MindFormers' predict)."""
    yaml_keys = {k: model_config.get(k) for k in YAML_KEYS if model_config.get(k) is not None}
    config = GenerationConfig.from_dict(folder_generation, yaml_keys, flags, {"seed": seed})
    eos = config.eos_token_id or list(getattr(tokenizer, "eos_token_ids", None) or [])
    if not eos and getattr(tokenizer, "eos_token_id", None) is not None:
        eos = [tokenizer.eos_token_id]
    pad = config.pad_token_id
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if config.max_new_tokens is None and config.max_length is None:
        config = config.replace(max_new_tokens=32)
    return config.replace(eos_token_id=eos, pad_token_id=pad)


def parallel_problems(data_parallel: int, pipeline_stage: int, expert_parallel: int) -> List[str]:
    """``run_mode: predict`` under msrun runs tensor parallel only (generation/generate.py: heads, MLP and
    vocabulary split, each rank its KV-cache slice); the other axes, named with why (a config rule: checked
    with the others, before any process group)."""
    why = {"data_parallel": (data_parallel, "generation keeps every prompt of a batch on every rank (the logits are "
                                            "gathered for the token choice); a batch split over dp is not designed"),
           "pipeline_stage": (pipeline_stage, "a pipelined KV cache (each stage its layers' cache, hidden states sent "
                                              "stage to stage for every token) is not designed"),
           "expert_parallel": (expert_parallel, "experts are spread over groups carved out of data parallel, which "
                                                "generation does not split (with model_parallel the experts stay "
                                                "whole on each rank, as in training)")}
    return [f"parallel_config.{key} = {size} with run_mode = 'predict': {reason}; set {key}: 1 (predict runs on one "
            "process or tensor parallel: model_parallel = the worker count)"
            for key, (size, reason) in why.items() if (size or 1) > 1]


def yaml_problems(model_config: Dict[str, Any]) -> List[str]:
    """The bad generation values of a YAML's ``model.model_config``, named by its keys (a config rule)."""
    given = {k: model_config.get(k) for k in YAML_KEYS if model_config.get(k) is not None}
    values = dict(defaults(), **{ALIASES.get(k, k): v for k, v in given.items()})
    yaml_name = {ALIASES.get(k, k): k for k in given}
    return [f"model.model_config.{yaml_name[key]} = {value!r}: {rule}"
            for key, value, rule in value_problems(SimpleNamespace(**values)) if key in yaml_name]


def check_batch_size(batch_size: int, dp: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--predict_batch_size {batch_size!r}: must be a positive integer")
    if batch_size % max(1, dp):
        raise ValueError(f"--predict_batch_size {batch_size}: must divide over data_parallel = {dp} (each dp rank "
                         f"takes batch_size / dp prompts); use a multiple of {dp}")


def generate(model, tokenizer, seq_length: int, ids: List[int], max_new_tokens: int = 32, jit: bool = False,
             config: Optional[GenerationConfig] = None, max_positions: Optional[int] = None) -> List[int]:
    """Greedy continuation of token ids; returns the new ids only (stops after EOS). ``seq_length`` is kept
    for the old signature (the cache holds the prompt and the new tokens, whatever the training length)."""
    if config is None:
        config = generation_config(tokenizer, None, {}, {"max_new_tokens": max_new_tokens})
    results, _ = Generator(model, config, jit=jit, max_positions=max_positions).generate([ids])
    return results[0].new_ids


def complete(model, tokenizer, seq_length: int, prompt: str, max_new_tokens: int = 32, **kwargs) -> str:
    """The prompt followed by its greedy continuation."""
    ids = encode_prompt(tokenizer, prompt)
    bos = 1 if tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id] else 0
    new = generate(model, tokenizer, seq_length, ids, max_new_tokens, **kwargs)
    return tokenizer.decode(ids[bos:] + new)


class _Stream:
    """Prints one row's text as its tokens arrive (rank 0); a text ending in U+FFFD (the bytes of a character
    not all generated yet) waits for the next token, so what is printed is the final text."""

    def __init__(self, tokenizer, prefix_ids: List[int], out):
        self.tokenizer, self.prefix, self.out = tokenizer, list(prefix_ids), out
        self.ids: List[int] = []
        self.shown = tokenizer.decode(self.prefix)
        out.write(self.shown)
        out.flush()

    def __call__(self, step, tokens, active):
        if not active[0]:
            return
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.decode(self.prefix + self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):   # not half a UTF-8 character
            self.out.write(text[len(self.shown):])
            self.out.flush()
            self.shown = text

    def finish(self, text: str) -> None:
        if text.startswith(self.shown):
            self.out.write(text[len(self.shown):])
        self.out.write("\n")
        self.out.flush()


def run_predict(model, tokenizer, prompts: Sequence[Any], config: GenerationConfig, batch_size: int = 1,
                jit: bool = False, max_positions: Optional[int] = None, output_dir: Optional[str] = None,
                out=None, log=None, parallel_config=None) -> List[Dict[str, Any]]:
    """Every prompt through the generator in batches of ``batch_size``; returns the JSONL rows (also written
    to ``output_dir/predict_results.jsonl``). ``out``: where texts go (stdout); ``log``: the stats line.
    ``parallel_config`` (a model config with tp > 1, under msrun): the step is sharded once, for one shape,
    so every batch is left-padded to the longest prompt of all and the last batch is filled up with copies
    of its first prompt (their results dropped): the tokens are those of one process."""
    out = sys.stdout if out is None else out
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    generator = Generator(model, config, jit=jit, max_positions=max_positions, parallel_config=parallel_config)
    for i, ids in enumerate(encoded):           # every prompt checked before anything runs
        try:
            generator.check([ids])
        except ValueError as e:
            raise ValueError(str(e).replace("prompt 0", f"prompt {i}")) from None
    width = max(len(ids) for ids in encoded) if parallel_config is not None else None
    rows, totals = [], {"prefill_tokens": 0, "prefill_seconds": 0.0, "decode_tokens": 0, "decode_seconds": 0.0}
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start:start + batch_size]
        real = len(batch)
        if parallel_config is not None:
            batch = batch + [batch[0]] * (batch_size - real)
        bos = [1 if tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id] else 0 for ids in batch]
        stream = _Stream(tokenizer, batch[0][bos[0]:], out) if real == 1 else None
        results, stats = generator.generate(batch, streamer=stream, width=width)
        for k in totals:
            totals[k] += getattr(stats, k)
        for j, r in enumerate(results[:real]):
            text = tokenizer.decode(r.token_ids[bos[j]:])
            if stream is not None:
                stream.finish(text)
            else:
                print(text, file=out, flush=True)
            prompt = prompts[start + j]
            rows.append({"prompt": prompt, "text": text, "completion": tokenizer.decode(r.new_ids),
                         "token_ids": r.token_ids, "new_token_ids": r.new_ids, "finish_reason": r.finish_reason})
    pre = totals["prefill_tokens"] / totals["prefill_seconds"] if totals["prefill_seconds"] else 0.0
    dec = totals["decode_tokens"] / totals["decode_seconds"] if totals["decode_seconds"] else 0.0
    line = (f"predict: {len(rows)} prompts in batches of {batch_size}: prefill {totals['prefill_tokens']} tokens "
            f"{pre:.1f} tokens/s, decode {totals['decode_tokens']} tokens {dec:.1f} tokens/s "
            f"({'jit' if jit else 'pynative'}, KV cache)")
    if output_dir:
        path = os.path.join(output_dir, RESULTS)
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        line += f"; results in {path}"
    (log or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    return rows
