"""SentencePiece tokenizer: training from text and a LlamaTokenizer-compatible wrapper.

Special ids follow Llama: ``<unk>``=0, ``<s>`` (BOS)=1, ``</s>`` (EOS)=2, and no pad piece in the vocabulary
(sentencepiece ``pad_id=-1``), so a model trained here has the same id layout as a Llama tokenizer.
Padding still needs an id: like MindFormers' ``LlamaTokenizer`` (``pad_token="<unk>"``) we pad with the unk
id 0. With ``byte_fallback`` (the default, as in Llama) the tokenizer never produces ``<unk>`` for real text,
so id 0 is unambiguous as padding, and an ``attention_mask`` is returned with every padded batch anyway.
"""
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


# tokenizer kind (a model family's ModelSpec.tokenizer) -> class built as cls(file)
TOKENIZER_KINDS = {"llama": LlamaTokenizer, "sentencepiece": LlamaTokenizer}


def build_tokenizer(kind, file):
    """The tokenizer of kind ``kind`` (``"llama"`` / ``"sentencepiece"``: a SentencePiece model with
    Llama's ids) read from ``file``; ``ValueError`` naming the known kinds for any other."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind {kind!r}: not known; known: {sorted(TOKENIZER_KINDS)}")
    return TOKENIZER_KINDS[kind](file)
