"""Tokenize text/JSONL once into a Megatron-style indexed dataset (<prefix>.bin + <prefix>.idx), the
format MindFormers' BlendedMegatronDatasetDataLoader and Megatron-LM read.

Example:  python scripts/preprocess_megatron.py --input corpus.jsonl --tokenizer out/tok.model \
              --output-prefix data/wiki
writes data/wiki_text_document.bin and .idx (Megatron's <output-prefix>_<json-key>_document naming).
Then train with, in a graph-mode YAML:

    train_dataset:
      data_loader:
        type: BlendedMegatronDatasetDataLoader
        config:
          data_path: ['1', 'data/wiki_text_document']
      tokenizer_file: out/tok.model      # or processor.tokenizer.vocab_file

Each document (a line of a text file, the --json-keys field of a JSONL line) is one sequence:
BOS + its ids (+ EOS with --append-eod, the default here), so the token stream equals the one the
text loader packs. Token dtype: uint16 below 65500 ids, else int32 (as Megatron's tools choose).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindformers_core.data.dataset import read_documents  # noqa: E402
from mindformers_core.data.megatron import token_dtype, write_indexed_dataset  # noqa: E402
from mindformers_core.data.tokenizer import LlamaTokenizer, check_files  # noqa: E402

_CHUNK = 4096


def documents(files, key, tokenizer, append_eod):
    for path in files:
        docs = list(read_documents(path, key))
        for i in range(0, len(docs), _CHUNK):
            yield from tokenizer.encode(docs[i:i + _CHUNK], add_bos=True, add_eos=append_eod)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files (one document per line) or .jsonl files")
    p.add_argument("--tokenizer", "--tokenizer-model", "--tokenizer_model", dest="tokenizer", required=True,
                   help="sentencepiece .model (scripts/train_tokenizer.py)")
    p.add_argument("--output-prefix", "--output_prefix", dest="output_prefix", required=True,
                   help="writes <output-prefix>_<json-key>_document.bin/.idx")
    p.add_argument("--json-keys", "--json_keys", dest="json_keys", default="text",
                   help="field holding the text in .jsonl inputs (one key)")
    p.add_argument("--append-eod", "--append_eod", dest="append_eod", default=True,
                   action=argparse.BooleanOptionalAction, help="end each document with EOS (default: yes)")
    args = p.parse_args(argv)
    try:
        files = check_files(args.input, "--input")
        tokenizer = LlamaTokenizer(args.tokenizer)
    except (ValueError, FileNotFoundError, OSError) as e:
        p.error(str(e))
    prefix = f"{args.output_prefix}_{args.json_keys}_document"
    docs, tokens = write_indexed_dataset(prefix, documents(files, args.json_keys, tokenizer, args.append_eod),
                                         token_dtype(tokenizer.vocab_size))
    print(f"wrote {prefix}.bin/.idx: {docs} documents, {tokens} tokens")
    return prefix


if __name__ == "__main__":
    main()
