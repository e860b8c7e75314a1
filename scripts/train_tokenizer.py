"""Train a SentencePiece tokenizer (Llama special ids) from text files.

Example:  python scripts/train_tokenizer.py --input corpus.txt --model_prefix out/tok --vocab_size 8000
With no --input, the built-in standard-library docstring corpus is built next to the model and used.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindformers_core.data.corpus import build_corpus  # noqa: E402
from mindformers_core.data.tokenizer import LlamaTokenizer, train_tokenizer  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="*", default=None, help="text files, one sentence/document per line")
    p.add_argument("--model_prefix", required=True, help="writes <prefix>.model and <prefix>.vocab")
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--model_type", default="bpe", choices=["bpe", "unigram", "char", "word"])
    p.add_argument("--no_byte_fallback", action="store_true")
    args = p.parse_args(argv)
    inputs = args.input or [build_corpus(args.model_prefix + ".corpus.txt")]
    model = train_tokenizer(inputs, args.model_prefix, args.vocab_size, model_type=args.model_type,
                            byte_fallback=not args.no_byte_fallback)
    tok = LlamaTokenizer(model)
    print(f"wrote {model}: vocab_size={tok.vocab_size} bos={tok.bos_token_id} eos={tok.eos_token_id} "
          f"pad={tok.pad_token_id}")


if __name__ == "__main__":
    main()
