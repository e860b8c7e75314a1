"""The handler chain of MindFormers' ``HFDataLoader`` (``data_loader.handler: [...]``), read as data.

A chain is a list of ``{type: NAME, ...}`` entries applied in order:

1. column handlers on the ``datasets.Dataset``: ``take`` (``n``), ``skip`` (``n``), ``shuffle``
   (``seed``), ``select_columns`` (``column_names``), ``remove_columns`` (``column_names``),
   ``rename_column`` (``original_column_name``, ``new_column_name``), ``rename_columns``
   (``column_mapping``) -- the ``datasets`` methods of those names;
2. one tokenizing handler turning each record into a document (prompt tokens masked out of the loss):
   ``AlpacaInstructDataHandler`` (``instruction``/``input``/``output`` columns, the Alpaca prompt template) or
   ``ChatTemplateDataHandler`` (a ``messages`` column of ``{role, content}``; the model folder's chat
   template, rendered with jinja2; only assistant turns are targets); a record longer than the row budget is
   fitted by ``data/truncation.py`` (the prompt, or earlier turns, cut first: the last target is kept);
3. optionally ``PackingHandler`` (``seq_length``, ``pack_strategy``: ``pack`` / ``truncate``).

:func:`parse_handlers` checks a chain without data (named errors, before anything loads);
:func:`check_columns` names a column a handler needs that the dataset lacks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .packing import PACK_STRATEGIES, Document
from .truncation import Turn, fit, flatten

ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")

# column handler -> (required keys, optional keys)
COLUMN_HANDLERS: Dict[str, tuple] = {
    "take": (("n",), ()), "skip": (("n",), ()), "shuffle": ((), ("seed",)),
    "select_columns": (("column_names",), ()), "remove_columns": (("column_names",), ()),
    "rename_column": (("original_column_name", "new_column_name"), ()), "rename_columns": (("column_mapping",), ()),
}
# keys MindFormers' tokenizing handlers take that change nothing here (the tokenizer is the model folder's)
_TOKENIZER_KEYS = ("tokenizer", "padding", "seq_length", "prompt_key", "output_columns", "type", "is_dynamic",
                   "max_length", "add_bos", "add_eos")
TOKENIZING = ("AlpacaInstructDataHandler", "ChatTemplateDataHandler")
PACKING = "PackingHandler"


@dataclass
class Chain:
    """A checked handler chain: column handlers, the tokenizing handler, the packing step (or None)."""
    column_ops: List[Dict[str, Any]] = field(default_factory=list)
    tokenize: Optional[Dict[str, Any]] = None
    pack_strategy: Optional[str] = None
    seq_lengths: Dict[str, int] = field(default_factory=dict)      # 'handler[i].seq_length' -> value given
    pack_seq_length: Optional[int] = None                           # PackingHandler's seq_length, if given

    def budget(self, seq_length: int) -> int:
        """Positions a document may fill: the rows' ``seq_length``, or the tokenizing handler's if shorter (or
        PackingHandler's, with ``truncate``)."""
        given = [self.tokenize.get("seq_length") if self.tokenize else None]
        if self.pack_strategy == "truncate":
            given.append(self.pack_seq_length)
        return min([seq_length] + [v for v in given if isinstance(v, int) and not isinstance(v, bool) and v > 0])

    def pack_limit(self, seq_length: int) -> Optional[int]:
        """``pack``: documents longer than PackingHandler's ``seq_length`` are skipped, as MindFormers'
        ``pack_examples`` skips them (None: no such limit below the document budget)."""
        if self.pack_strategy != "pack" or self.pack_seq_length is None:
            return None
        return self.pack_seq_length if self.pack_seq_length < self.budget(seq_length) else None


def parse_handlers(handlers: Any, where: str = "train_dataset.data_loader.handler") -> Chain:
    """The chain of ``handlers`` (the YAML list), or ``ValueError`` listing every problem by key."""
    problems: List[str] = []
    chain = Chain()
    if not isinstance(handlers, list) or not handlers:
        raise ValueError(f"{where} = {handlers!r}: must be a list of {{type: NAME, ...}} entries holding a "
                         f"tokenizing handler ({', '.join(TOKENIZING)})")
    for i, h in enumerate(handlers):
        at = f"{where}[{i}]"
        if not isinstance(h, dict) or not isinstance(h.get("type"), str):
            problems.append(f"{at} = {h!r}: must be a mapping with a 'type'")
            continue
        kind = h["type"]
        if isinstance(h.get("seq_length"), int) and not isinstance(h.get("seq_length"), bool):
            chain.seq_lengths[f"{at}.seq_length"] = h["seq_length"]
        if kind in COLUMN_HANDLERS:
            need, optional = COLUMN_HANDLERS[kind]
            missing = [k for k in need if k not in h]
            extra = sorted(set(h) - set(need) - set(optional) - {"type"})
            if missing:
                problems.append(f"{at} (type {kind}): needs {missing}")
            if extra:
                problems.append(f"{at} (type {kind}): unknown keys {extra}; it takes {list(need + optional)}")
            if chain.tokenize is not None:
                problems.append(f"{at} (type {kind}): column handlers come before the tokenizing handler "
                                f"({chain.tokenize['type']})")
            if kind in ("take", "skip") and "n" in h and not (isinstance(h["n"], int) and h["n"] >= 0):
                problems.append(f"{at}.n = {h.get('n')!r}: must be an integer >= 0")
            chain.column_ops.append(dict(h))
        elif kind in TOKENIZING:
            if chain.tokenize is not None:
                problems.append(f"{at} (type {kind}): a second tokenizing handler; the chain has "
                                f"{chain.tokenize['type']} already")
            extra = sorted(set(h) - set(_TOKENIZER_KEYS) - {"messages_key", "system_key"})
            if extra:
                problems.append(f"{at} (type {kind}): unknown keys {extra}")
            chain.tokenize = dict(h)
        elif kind == PACKING:
            strategy = h.get("pack_strategy", "pack")
            if strategy not in PACK_STRATEGIES:
                problems.append(f"{at}.pack_strategy = {strategy!r}: must be one of {list(PACK_STRATEGIES)}")
            extra = sorted(set(h) - {"type", "seq_length", "pack_strategy"})
            if extra:
                problems.append(f"{at} (type {kind}): unknown keys {extra}; it takes seq_length, pack_strategy")
            if chain.tokenize is None:
                problems.append(f"{at} (type {kind}): packs tokenized documents, so it comes after the "
                                f"tokenizing handler ({', '.join(TOKENIZING)})")
            chain.pack_strategy = strategy
            if isinstance(h.get("seq_length"), int) and not isinstance(h.get("seq_length"), bool):
                chain.pack_seq_length = h["seq_length"]
        else:
            problems.append(f"{at}.type = {kind!r}: not a handler here; known: "
                            f"{', '.join(list(COLUMN_HANDLERS) + list(TOKENIZING) + [PACKING])}")
    if chain.tokenize is None:
        problems.append(f"{where}: no tokenizing handler; add one of {', '.join(TOKENIZING)}")
    if problems:
        raise ValueError("; ".join(problems))
    return chain


def required_columns(tokenize: Dict[str, Any]) -> List[str]:
    """Columns the tokenizing handler reads (``input`` of Alpaca is optional)."""
    if tokenize["type"] == "AlpacaInstructDataHandler":
        return ["instruction", "output"]
    return [tokenize.get("messages_key", "messages")]


def apply_column_ops(ds, ops: Sequence[Dict[str, Any]], where: str = "train_dataset.data_loader.handler"):
    """The column handlers applied to a ``datasets.Dataset`` in order (``take`` beyond the end keeps every
    row, as ``datasets``' streaming ``take`` does); a column they name that is missing is a ``ValueError``."""
    for op in ops:
        kind, args = op["type"], {k: v for k, v in op.items() if k != "type"}
        named = []
        if kind in ("select_columns", "remove_columns"):
            named = [args["column_names"]] if isinstance(args["column_names"], str) else list(args["column_names"])
        elif kind == "rename_column":
            named = [args["original_column_name"]]
        elif kind == "rename_columns":
            named = list(dict(args["column_mapping"]))
        missing = [c for c in named if c not in ds.column_names]
        if missing:
            raise ValueError(f"{where} (type {kind}): column(s) {missing} not in the dataset, which has "
                             f"{ds.column_names}")
        if kind == "take":
            ds = ds.select(range(min(int(args["n"]), len(ds))))
        elif kind == "skip":
            ds = ds.select(range(min(int(args["n"]), len(ds)), len(ds)))
        else:
            ds = getattr(ds, kind)(**args)
    return ds


def check_columns(column_names: Sequence[str], tokenize: Dict[str, Any], source: str) -> None:
    missing = [c for c in required_columns(tokenize) if c not in column_names]
    if missing:
        raise ValueError(f"{tokenize['type']} needs column(s) {missing}; {source} has {list(column_names)} "
                         "(rename a column with a rename_column handler before it)")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def alpaca_turns(record, tokenizer) -> List[Turn]:
    """An Alpaca record as a prompt turn (the template, with or without ``input``, after BOS) and a response
    turn (``output`` then EOS, the targets)."""
    instruction, given = _text(record.get("instruction")), _text(record.get("input"))
    prompt = (ALPACA_PROMPT.format(instruction=instruction, input=given) if given.strip()
              else ALPACA_PROMPT_NO_INPUT.format(instruction=instruction))
    return [Turn("user", [(tokenizer.encode(prompt, add_bos=True), 0)]),
            Turn("assistant", [(tokenizer.encode(_text(record.get("output")), add_bos=False, add_eos=True), 1)])]


def alpaca_documents(records, tokenizer) -> List[Document]:
    """Alpaca records -> documents (whole): prompt = the Alpaca template (with or without ``input``) after
    BOS, response = ``output`` then EOS; only the response's tokens are targets."""
    return [_document_from(*flatten(alpaca_turns(r, tokenizer))) for r in records]


def chat_renderer(template: Optional[str], tokenizer, where: str):
    """``render(messages, add_generation_prompt)`` of a chat template with jinja2 (the engine
    ``transformers`` renders chat templates with); named errors for no template / no jinja2."""
    if not template:
        raise ValueError(f"{where}: ChatTemplateDataHandler needs the model folder's chat template "
                         f"(chat_template.jinja or tokenizer_config.json's chat_template); "
                         f"{getattr(tokenizer, 'folder', '?')} has none")
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ValueError(f"{where}: rendering a chat template needs jinja2 (pip install jinja2)") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)
    specials = {}
    for role in ("bos", "eos", "pad"):
        tid = getattr(tokenizer, f"{role}_token_id", None)
        specials[f"{role}_token"] = tokenizer.tok.id_to_token(tid) if tid is not None and hasattr(tokenizer, "tok") else ""

    def render(messages, add_generation_prompt=False):
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **specials)
    return render


def chat_turns(record, n: int, tokenizer, render, key: str, where: str) -> List[Turn]:
    """A chat record (``messages``: ``[{role, content}, ...]``) as turns, rendered by the chat template turn
    by turn: the text an assistant turn adds after the generation prompt is a target, every other piece
    (system/user turns, role headers) is prompt. Each piece is encoded alone (special tokens in the text are
    read as their ids)."""
    messages = record.get(key)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                  for m in messages):
        raise ValueError(f"{where}: record {n}: {key} must be a list of {{role, content}} mappings, got "
                         f"{messages!r:.200}")
    done = ""
    turns: List[Turn] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = render(messages[:i], add_generation_prompt=True)
            full = render(messages[:i + 1])
            pieces = [(head[len(done):], 0), (full[len(head):], 1)] if head.startswith(done) and \
                full.startswith(head) else None
        else:
            full = render(messages[:i + 1])
            pieces = [(full[len(done):], 0)] if full.startswith(done) else None
        if pieces is None:
            raise ValueError(f"{where}: record {n}: the chat template does not render the conversation "
                             "turn by turn as a growing text; its assistant turns cannot be told apart")
        turns.append(Turn(str(m["role"]), [(tokenizer.encode(text, add_bos=False) if text else [], t)
                                            for text, t in pieces]))
        done = full
    return turns


def chat_documents(records, tokenizer, tokenize: Dict[str, Any], where: str) -> List[Document]:
    """Chat records -> documents (whole); see :func:`chat_turns`."""
    key = tokenize.get("messages_key", "messages")
    render = chat_renderer(getattr(tokenizer, "chat_template", None), tokenizer, where)
    return [_document_from(*flatten(chat_turns(r, n, tokenizer, render, key, where))) for n, r in enumerate(records)]


def _document_from(ids: List[int], target: List[int]) -> Document:
    import numpy as np
    tokens = np.asarray(ids, dtype=np.int64)
    mask = np.asarray(target, dtype=np.float32)
    return {"input_ids": tokens[:-1], "labels": tokens[1:], "loss_mask": mask[1:]}


def tokenize_records(records, tokenizer, tokenize: Dict[str, Any], where: str) -> List[Document]:
    """Every record as its whole document (no budget)."""
    if tokenize["type"] == "AlpacaInstructDataHandler":
        return alpaca_documents(records, tokenizer)
    return chat_documents(records, tokenizer, tokenize, where)


def fitted_documents(records, tokenizer, tokenize: Dict[str, Any], where: str,
                     budget: int) -> List[Tuple[Document, bool]]:
    """Every record as a document of at most ``budget`` tokens (``data/truncation.py``: the prompt or earlier
    turns cut first, the last target kept), with whether it was cut."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if tokenize["type"] == "AlpacaInstructDataHandler":
        turns = (alpaca_turns(r, tokenizer) for r in records)
    else:
        key = tokenize.get("messages_key", "messages")
        render = chat_renderer(getattr(tokenizer, "chat_template", None), tokenizer, where)
        turns = (chat_turns(r, n, tokenizer, render, key, where) for n, r in enumerate(records))
    out = []
    for t in turns:
        ids, target, cut = fit(t, budget, bos)
        out.append((_document_from(ids, target), cut))
    return out
