"""Fitting one fine-tuning record into a row's budget without losing its target.

A tokenized record is a list of :class:`Turn` s (a role and its pieces of ``(token ids, is_target)``): the
Alpaca handler gives a prompt turn and a response turn, the chat handler one turn per message (an assistant
turn is its role header, not a target, then its text, a target). :func:`fit` returns the record's tokens and
target flags within ``budget`` tokens (a document of ``n`` tokens fills ``n - 1`` positions of a row, so a row
of ``seq_length`` positions takes ``seq_length + 1`` tokens):

1. a record that fits is unchanged;
2. turns after the last one holding a target are dropped (they train nothing);
3. the exchanges (a question and the answers after it, whole turns) between a leading system turn and the
   last exchange (the last target turn and the turns right before it that it answers) are dropped,
   earliest first, until the record fits;
4. still too long: everything before the last target piece is the prompt, that piece the response. The
   response keeps ``min(R, max(budget - P, budget // 2))`` tokens (all of it when the prompt leaves room or
   when it needs at most half the budget; else at least half), cut at its end; the prompt fills the rest and
   loses its *earliest* tokens (a leading BOS stays first), so the text next to the response is kept.

A record with a target token keeps at least one (``budget >= 2``). MindFormers' own handlers cut a record at
its end (``input_ids[:seq_length]``: the prompt kept, the response dropped first); docs/finetune.md says where
we differ and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

Piece = Tuple[List[int], int]          # (token ids, 1 if they are targets else 0)


@dataclass
class Turn:
    role: str
    pieces: List[Piece] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(ids) for ids, _ in self.pieces)

    @property
    def has_target(self) -> bool:
        return any(t and ids for ids, t in self.pieces)


def flatten(turns: Sequence[Turn]) -> Tuple[List[int], List[int]]:
    ids: List[int] = []
    target: List[int] = []
    for turn in turns:
        for piece, t in turn.pieces:
            ids += list(piece)
            target += [int(t)] * len(piece)
    return ids, target


def _size(turns: Sequence[Turn]) -> int:
    return sum(t.size for t in turns)


def share(prompt: int, response: int, budget: int) -> Tuple[int, int]:
    """``(prompt tokens kept, response tokens kept)`` of a prompt/response pair in ``budget`` tokens (rule 4 of
    the module docstring)."""
    if prompt + response <= budget:
        return prompt, response
    kept = min(response, max(budget - prompt, budget // 2))
    return min(prompt, budget - kept), kept


def cut_prompt(ids: List[int], keep: int, bos_id: Optional[int]) -> List[int]:
    """The last ``keep`` tokens of a prompt, its leading BOS (if any) kept first."""
    if keep >= len(ids):
        return list(ids)
    if keep <= 0:
        return []
    if bos_id is not None and ids and ids[0] == bos_id:
        return [ids[0]] + (list(ids[len(ids) - (keep - 1):]) if keep > 1 else [])
    return list(ids[len(ids) - keep:])


def fit(turns: Sequence[Turn], budget: int, bos_id: Optional[int] = None) -> Tuple[List[int], List[int], bool]:
    """``(ids, target, cut)`` of a record within ``budget`` tokens; ``cut``: whether anything was removed."""
    turns = list(turns)
    if _size(turns) <= budget:
        ids, target = flatten(turns)
        return ids, target, False
    last = max((i for i, t in enumerate(turns) if t.has_target), default=None)
    if last is None:                              # nothing to keep a target of: the head, as a row would
        ids, target = flatten(turns)
        return ids[:budget], target[:budget], True
    turns = turns[:last + 1]                      # rule 2
    start = last                                  # the last exchange: the target turn and what it answers
    while start > 0 and not turns[start - 1].has_target and turns[start - 1].role != "system":
        start -= 1
    head = 1 if turns and turns[0].role == "system" and start > 0 else 0
    exchanges: List[List[int]] = []               # the turns between: a question and the answer(s) after it
    for i in range(head, start):
        if not exchanges or (not turns[i].has_target and turns[exchanges[-1][-1]].has_target):
            exchanges.append([])
        exchanges[-1].append(i)
    while exchanges and _size(turns) > budget:    # rule 3: earliest exchanges first
        for i in exchanges.pop(0):
            turns[i] = Turn(turns[i].role)
    turns = [t for t in turns if t.pieces]
    if _size(turns) <= budget:
        ids, target = flatten(turns)
        return ids, target, True
    ids, target = flatten(turns)                  # rule 4: prompt / response around the last target piece
    end = len(ids)
    while end > 0 and not target[end - 1]:
        end -= 1
    begin = end
    while begin > 0 and target[begin - 1]:
        begin -= 1
    prompt_ids, prompt_target = ids[:begin], target[:begin]
    response = ids[begin:end]
    p, r = share(len(prompt_ids), len(response), budget)
    kept_prompt = cut_prompt(prompt_ids, p, bos_id)
    # the prompt's kept tokens keep their flags (an earlier assistant answer inside it stays a target)
    if len(kept_prompt) == len(prompt_ids):
        kept_flags = list(prompt_target)
    elif kept_prompt and bos_id is not None and prompt_ids[0] == bos_id and kept_prompt[0] == bos_id:
        kept_flags = [prompt_target[0]] + (list(prompt_target[len(prompt_ids) - (p - 1):]) if p > 1 else [])
    else:
        kept_flags = list(prompt_target[len(prompt_ids) - p:]) if p > 0 else []
    return kept_prompt + list(response[:r]), kept_flags + [1] * r, True
