"""``run_mode: predict``: greedy generation from the loaded weights on one process.

The model sees a fixed ``seq_length`` window (the shapes it was built and compiled for): the prompt
is right-padded, and each new token is read at the last real position.
"""
from __future__ import annotations

from typing import List

import numpy as np
from mindspore import Tensor


def generate(model, tokenizer, seq_length: int, ids: List[int], max_new_tokens: int = 32) -> List[int]:
    """Greedy continuation of token ids; returns the new ids only (stops after EOS)."""
    ids, new = list(ids), []
    for _ in range(max_new_tokens):
        window = ids[-seq_length:]
        x = np.full((1, seq_length), tokenizer.pad_token_id, np.int32)
        x[0, :len(window)] = window
        logits = model(Tensor(x)).asnumpy()
        nxt = int(logits[0, len(window) - 1].argmax())
        ids.append(nxt)
        new.append(nxt)
        if nxt == tokenizer.eos_token_id:
            break
    return new


def complete(model, tokenizer, seq_length: int, prompt: str, max_new_tokens: int = 32) -> str:
    """The prompt followed by its greedy continuation."""
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]     # Qwen's tokenizers have none
    ids = bos + tokenizer.encode(prompt, add_bos=False)
    new = generate(model, tokenizer, seq_length, ids, max_new_tokens)
    return tokenizer.decode(ids[len(bos):] + new)
