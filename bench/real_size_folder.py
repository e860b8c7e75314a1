"""Write a Hugging Face folder shaped like Qwen3-0.6B (random weights) with transformers, for bench/real_size.py.

Runs under ANOTHER interpreter than the project's (a throwaway venv with torch and transformers; never the
project's venv): it imports nothing from the project. The shape is Qwen3-0.6B's published config.json (28 layers,
hidden 1024, 16 query / 8 key-value heads of 128, FFN 3072, vocab 151936, tied embeddings, bf16); the weights are
transformers' own random initialisation under a fixed seed, saved by ``save_pretrained`` as one
``model.safetensors`` (about 1.19 GB in bf16). The folder is never stored in the repository.

    /path/to/torch-venv/bin/python bench/real_size_folder.py OUT [--layers 28] [--dtype bfloat16]
"""
import argparse
import json
import os
import sys

QWEN3_06B = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645,
    initializer_range=0.02, use_sliding_window=False, sliding_window=None, max_window_layers=28,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(a.seed)
    config = Qwen3Config(**dict(QWEN3_06B, num_hidden_layers=a.layers, max_window_layers=a.layers))
    model = Qwen3ForCausalLM(config).to(getattr(torch, a.dtype))
    model.save_pretrained(a.out, safe_serialization=True)
    with open(os.path.join(a.out, "config.json")) as f:
        saved = json.load(f)
    print(json.dumps({"folder": a.out, "layers": a.layers, "dtype": a.dtype,
                      "bytes": sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out)),
                      "model_type": saved.get("model_type")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
