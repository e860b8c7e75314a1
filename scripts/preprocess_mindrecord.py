"""Tokenize text/JSONL once into a MindRecord file of packed samples (train_dataset.type: mindrecord).

Example:  python scripts/preprocess_mindrecord.py --input corpus.txt --tokenizer out/tok.model \
              --seq_length 128 --output data/corpus_128.mindrecord
Then train with  --train_dataset.type mindrecord --train_dataset.dataset_dir data/corpus_128.mindrecord
(or the directory holding it) and the same tokenizer and seq_length.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindformers_core.data.mindrecord import write_mindrecord  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files (one document per line) or .jsonl files")
    p.add_argument("--tokenizer", required=True, help="sentencepiece .model (scripts/train_tokenizer.py)")
    p.add_argument("--seq_length", type=int, required=True, help="model.model_config.seq_length of the run")
    p.add_argument("--output", required=True, help="the .mindrecord file to write (plus its .db index)")
    p.add_argument("--text_key", default="text", help="field holding the text in .jsonl inputs")
    args = p.parse_args(argv)
    rows = write_mindrecord(args.input, args.tokenizer, args.seq_length, args.output, args.text_key)
    print(f"wrote {args.output}: {rows} samples of {args.seq_length} tokens")


if __name__ == "__main__":
    main()
