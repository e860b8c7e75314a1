"""Data: built-in corpus, sentencepiece and Hugging Face tokenizers, packed and resumable pretraining datasets."""
from .corpus import DEFAULT_MODULES, build_corpus, iter_documents
from .dataset import PackedDataset, create_dataset, read_documents, tokenize_to_cache
from .tokenizer import HFTokenizer, LlamaTokenizer, build_tokenizer, train_tokenizer

__all__ = ["DEFAULT_MODULES", "HFTokenizer", "LlamaTokenizer", "PackedDataset", "build_corpus", "build_tokenizer",
           "create_dataset", "iter_documents", "read_documents", "tokenize_to_cache", "train_tokenizer"]
