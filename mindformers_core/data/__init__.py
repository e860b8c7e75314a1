"""Data: built-in corpus, sentencepiece and Hugging Face tokenizers, packed and resumable pretraining datasets,
fine-tuning data (HFDataLoader: local files through the datasets library, handlers, packing)."""
from .corpus import DEFAULT_MODULES, build_corpus, iter_documents
from .dataset import PackedDataset, create_dataset, read_documents, tokenize_to_cache
from .tokenizer import HFTokenizer, LlamaTokenizer, build_tokenizer, train_tokenizer
from .handlers import parse_handlers
from .hf_dataset import SFTDataset, build_sft_rows, hf_sft_dataset, load_hf_dataset
from .packing import build_rows, make_document

__all__ = ["DEFAULT_MODULES", "HFTokenizer", "LlamaTokenizer", "PackedDataset", "SFTDataset", "build_corpus",
           "build_rows", "build_sft_rows", "build_tokenizer", "create_dataset", "hf_sft_dataset", "iter_documents",
           "load_hf_dataset", "make_document", "parse_handlers", "read_documents", "tokenize_to_cache",
           "train_tokenizer"]
