"""Tokenizers: SentencePiece (training from text, ``LlamaTokenizer``) and Hugging Face's ``tokenizer.json``
(``HFTokenizer``), both with the same interface (``encode``/``decode``/``batch_encode``, ``vocab_size``,
``bos/eos/pad_token_id``, ``vocab_file``) so the data pipeline, the trainer and predict take either.

Special ids follow Llama: ``<unk>``=0, ``<s>`` (BOS)=1, ``</s>`` (EOS)=2, and no pad piece in the vocabulary
(sentencepiece ``pad_id=-1``), so a model trained here has the same id layout as a Llama tokenizer.
Padding still needs an id: like MindFormers' ``LlamaTokenizer`` (``pad_token="<unk>"``) we pad with the unk
id 0. With ``byte_fallback`` (the default, as in Llama) the tokenizer never produces ``<unk>`` for real text,
so id 0 is unambiguous as padding, and an ``attention_mask`` is returned with every padded batch anyway.
"""
import json
import os

import numpy as np
import sentencepiece as spm

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def train_tokenizer(text_files, model_prefix, vocab_size, model_type="bpe", byte_fallback=True,
                    character_coverage=0.9995, max_sentence_length=16384):
    """Train a SentencePiece model on ``text_files``; return the path of ``<model_prefix>.model``.

    Settings are Llama's (BPE, identity normalisation, split digits, byte fallback) plus what makes the
    result reproducible: one thread, no sentence sampling and no shuffling, so the same input gives a
    byte-identical model. Byte fallback needs 256 byte pieces, so ``vocab_size`` must then exceed 259;
    characters outside ``character_coverage`` are then still encodable (as bytes).
    """
    files = check_files(text_files, "text_files")
    floor = 3 + (256 if byte_fallback else 0)
    if vocab_size <= floor:
        raise ValueError(f"vocab_size={vocab_size} too small: must be > {floor} "
                         f"(3 special pieces{' + 256 byte pieces' if byte_fallback else ''})")
    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(os.fspath(f) for f in files), model_prefix=os.fspath(model_prefix),
        vocab_size=vocab_size, model_type=model_type, byte_fallback=byte_fallback,
        character_coverage=character_coverage, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, add_dummy_prefix=True,
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=max_sentence_length, minloglevel=2)
    return f"{os.fspath(model_prefix)}.model"


def check_files(files, argument):
    """``files`` (one path or several) as a list of existing paths; errors name ``argument``."""
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not files:
        raise ValueError(f"{argument} is empty")
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{argument}: no such file {os.fspath(f)!r}")
    return [os.fspath(f) for f in files]


class LlamaTokenizer:
    """Encode/decode with a SentencePiece model, with the names of MindFormers/HF ``LlamaTokenizer``."""

    def __init__(self, vocab_file, pad_token_id=UNK_ID):
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(f"vocab_file: no such file {os.fspath(vocab_file)!r}")
        self.vocab_file = os.fspath(vocab_file)
        self.sp = spm.SentencePieceProcessor(model_file=self.vocab_file)
        self.pad_token_id = pad_token_id

    @property
    def vocab_size(self):
        return self.sp.get_piece_size()

    @property
    def bos_token_id(self):
        return self.sp.bos_id()

    @property
    def eos_token_id(self):
        return self.sp.eos_id()

    @property
    def unk_token_id(self):
        return self.sp.unk_id()

    def _wrap(self, ids, add_bos, add_eos):
        return ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])

    def encode(self, text, add_bos=True, add_eos=False):
        """Token ids of one string (a list of strings gives a list of lists, encoded in one C++ call)."""
        if isinstance(text, str):
            return self._wrap(self.sp.encode(text), add_bos, add_eos)
        return [self._wrap(ids, add_bos, add_eos) for ids in self.sp.encode(list(text))]

    def decode(self, ids, skip_special_tokens=True):
        """Text of ``ids``; BOS/EOS/pad are dropped first so padded rows decode cleanly."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if skip_special_tokens:
            special = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
            ids = [i for i in ids if i not in special]
        return self.sp.decode(ids)

    def tokenize(self, text):
        """Pieces of ``text`` (strings), for inspection."""
        return self.sp.encode(text, out_type=str)

    def convert_tokens_to_ids(self, tokens):
        return self.sp.piece_to_id(tokens)

    def batch_encode(self, texts, max_length, add_bos=True, add_eos=False, padding_side="right"):
        """Encode ``texts`` into ``int32`` arrays of shape ``(len(texts), max_length)``.

        Rows longer than ``max_length`` are truncated (from the end); shorter rows are padded with
        ``pad_token_id`` on ``padding_side``. Returns ``{"input_ids", "attention_mask"}`` (mask 1 = real).
        """
        if max_length <= 0:
            raise ValueError(f"max_length must be positive, got {max_length}")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        rows = self.encode(list(texts), add_bos=add_bos, add_eos=add_eos)
        ids = np.full((len(rows), max_length), self.pad_token_id, dtype=np.int32)
        mask = np.zeros((len(rows), max_length), dtype=np.int32)
        for i, row in enumerate(rows):
            row = row[:max_length]
            sl = slice(0, len(row)) if padding_side == "right" else slice(max_length - len(row), max_length)
            ids[i, sl], mask[i, sl] = row, 1
        return {"input_ids": ids, "attention_mask": mask}

    __call__ = batch_encode


class HFTokenizer:
    """A Hugging Face fast tokenizer (``tokenizer.json``) read with the ``tokenizers`` package (no
    transformers, no torch), with :class:`LlamaTokenizer`'s interface.

    ``path``: a model folder or its ``tokenizer.json``. Special tokens are read from the files next to it,
    first found wins: ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``;
    a string or ``{"content": ...}``), ``special_tokens_map.json``, then ``generation_config.json``
    (``bos_token_id``/``eos_token_id``/``pad_token_id``; an ``eos_token_id`` list gives the first as
    ``eos_token_id`` and all of them in ``eos_token_ids``). A token that is not given stays ``None``
    (Qwen has no BOS), except the pad id, which falls back to the EOS id (what ``transformers``' ``generate``
    pads with), then to 0; padded rows come with an ``attention_mask`` anyway.

    ``encode(text, add_bos=True, add_eos=False)`` encodes without the tokenizer's own post-processor and
    adds BOS/EOS itself (nothing when the tokenizer has no such token), so the same call gives the same ids
    for a Llama-style folder (whose post-processor prepends BOS) and for a Qwen one (no BOS at all).
    ``vocab_size`` is the largest id + 1 over the vocabulary and added tokens (Hugging Face's
    ``len(tokenizer)``, not its ``vocab_size`` attribute, which leaves added tokens out).
    ``chat_template``: the Jinja text of ``chat_template.jinja`` or ``tokenizer_config.json`` (None if none).
    """

    FILE = "tokenizer.json"

    def __init__(self, path):
        path = os.fspath(path)
        if os.path.isdir(path):
            folder, file = path, os.path.join(path, self.FILE)
            if not os.path.isfile(file):
                raise FileNotFoundError(_no_tokenizer_json(folder))
        elif os.path.isfile(path):
            folder, file = os.path.dirname(os.path.abspath(path)), path
        else:
            raise FileNotFoundError(f"Hugging Face tokenizer: no such file or folder {path!r}")
        from tokenizers import Tokenizer
        try:
            self.tok = Tokenizer.from_file(file)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
            hint = ("; a SentencePiece .model is read by the 'llama' tokenizer kind"
                    if file.endswith(".model") else "")
            raise ValueError(f"{file}: not a Hugging Face tokenizer.json ({e}){hint}") from None
        self.vocab_file, self.folder = os.fspath(file), folder
        self._special = self._read_special_tokens()
        pad = self._special.get("pad")
        self.pad_token_id = pad if pad is not None else (self.eos_token_id if self.eos_token_id is not None else 0)
        self.chat_template = self._read_chat_template()
        self._vocab_size = max(self.tok.get_vocab(with_added_tokens=True).values()) + 1

    @classmethod
    def from_folder(cls, folder):
        """The tokenizer of a Hugging Face model folder; ``FileNotFoundError`` naming the folder when it
        has no ``tokenizer.json``."""
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"Hugging Face tokenizer: no such folder {folder!r}")
        return cls(folder)

    def _json(self, name):
        path = os.path.join(self.folder, name)
        if not os.path.isfile(path):
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot be read as JSON ({e})") from None
        return value if isinstance(value, dict) else {}

    def _read_special_tokens(self):
        """role -> id from tokenizer_config.json, special_tokens_map.json, generation_config.json."""
        found, eos_ids = {}, []
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            config = self._json(name)
            for role in ("bos", "eos", "pad", "unk"):
                token = config.get(f"{role}_token")
                if isinstance(token, dict):
                    token = token.get("content")
                if role in found or not isinstance(token, str):
                    continue
                tid = self.tok.token_to_id(token)
                if tid is None:
                    raise ValueError(f"{os.path.join(self.folder, name)}: {role}_token = {token!r} is not in the "
                                     f"vocabulary of {self.vocab_file}")
                found[role] = tid
        generation = self._json("generation_config.json")
        for role in ("bos", "eos", "pad"):
            value = generation.get(f"{role}_token_id")
            values = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)]
            if role == "eos":
                eos_ids = values
            if values and role not in found:
                found[role] = values[0]
        if found.get("unk") is None:
            unk = getattr(self.tok.model, "unk_token", None)
            if isinstance(unk, str) and self.tok.token_to_id(unk) is not None:
                found["unk"] = self.tok.token_to_id(unk)
        found["eos_ids"] = tuple(dict.fromkeys(([found["eos"]] if "eos" in found else []) + eos_ids))
        return found

    def _read_chat_template(self):
        path = os.path.join(self.folder, "chat_template.jinja")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
        template = self._json("tokenizer_config.json").get("chat_template")
        if isinstance(template, list):      # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def bos_token_id(self):
        return self._special.get("bos")

    @property
    def eos_token_id(self):
        return self._special.get("eos")

    @property
    def eos_token_ids(self):
        """Every id that ends generation: the EOS token and generation_config.json's ``eos_token_id``(s)."""
        return self._special["eos_ids"]

    @property
    def unk_token_id(self):
        return self._special.get("unk")

    @property
    def all_special_ids(self):
        """The ids of the tokens marked special in tokenizer.json, with BOS/EOS/pad."""
        ids = {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}
        return sorted(ids | {i for i in (self.bos_token_id, self.eos_token_id, self.pad_token_id) if i is not None})

    def _wrap(self, ids, add_bos, add_eos):
        bos = [self.bos_token_id] if add_bos and self.bos_token_id is not None else []
        eos = [self.eos_token_id] if add_eos and self.eos_token_id is not None else []
        return bos + list(ids) + eos

    def encode(self, text, add_bos=True, add_eos=False):
        """Token ids of one string (a list of strings gives a list of lists, encoded in one batch call)."""
        if isinstance(text, str):
            return self._wrap(self.tok.encode(text, add_special_tokens=False).ids, add_bos, add_eos)
        return [self._wrap(e.ids, add_bos, add_eos)
                for e in self.tok.encode_batch_fast(list(text), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens=True):
        """Text of ``ids``; special tokens (BOS/EOS/pad and those marked special) are dropped by default."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if skip_special_tokens:
            special = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
            ids = [i for i in ids if i not in special]
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def tokenize(self, text):
        """Tokens of ``text`` (strings, in the tokenizer's own alphabet, e.g. ``Ġ`` for a space)."""
        return self.tok.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.tok.token_to_id(tokens)
        return [self.tok.token_to_id(t) for t in tokens]

    @property
    def cache_key(self):
        """What the token ids depend on besides tokenizer.json (dataset.cache_file_for hashes it)."""
        return f"hf|bos={self.bos_token_id}|eos={self.eos_token_id}"

    batch_encode = LlamaTokenizer.batch_encode
    __call__ = batch_encode

    def __repr__(self):
        return (f"HFTokenizer({self.vocab_file!r}, vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={self.eos_token_id}, pad={self.pad_token_id})")


def _no_tokenizer_json(folder):
    has_model = os.path.isfile(os.path.join(folder, "tokenizer.model"))
    return (f"Hugging Face tokenizer: no tokenizer.json in {os.fspath(folder)!r}"
            + (" (it has a SentencePiece tokenizer.model: read it with the 'llama' tokenizer kind)" if has_model
               else " (a SentencePiece tokenizer.model would be read by the 'llama' tokenizer kind)"))


def as_tokenizer(tokenizer):
    """``tokenizer`` itself when it is a tokenizer object; a path: a folder or ``.json`` file gives an
    :class:`HFTokenizer`, anything else a SentencePiece :class:`LlamaTokenizer`."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    path = os.fspath(tokenizer)
    if os.path.isdir(path) or path.endswith(".json"):
        return HFTokenizer(path)
    return LlamaTokenizer(path)


# tokenizer kind (a model family's ModelSpec.tokenizer) -> class built as cls(file)
TOKENIZER_KINDS = {"llama": LlamaTokenizer, "sentencepiece": LlamaTokenizer, "hf": HFTokenizer}


def build_tokenizer(kind, file):
    """The tokenizer of kind ``kind`` read from ``file``: ``"llama"`` / ``"sentencepiece"``: a SentencePiece
    model with Llama's ids; ``"hf"``: a Hugging Face ``tokenizer.json`` or the model folder holding it.
    ``ValueError`` naming the known kinds for any other."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind {kind!r}: not known; known: {sorted(TOKENIZER_KINDS)}")
    return TOKENIZER_KINDS[kind](file)
