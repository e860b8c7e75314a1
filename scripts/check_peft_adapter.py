"""Check a LoRA run's exports against the real libraries (run by hand in a throwaway venv; the suite never
imports torch, transformers or peft).

Made with the venv of scripts/make_hf_fixtures.py plus ``pip install peft`` (used: torch 2.13.0+cpu,
transformers 5.24.0, peft 0.21.2, CPython 3.11). Inputs: the base model folder, the merged Hugging Face export
(``--export_hf_dir DIR``), the PEFT adapter folder (``DIR_peft``) and an ``.npz`` with ``ids`` (b, s) and our
``logits`` of base + adapters on them (written from the trained model, e.g. ``trainer.built.model(ids)``)::

    /tmp/hfvenv/bin/python scripts/check_peft_adapter.py BASE DIR DIR_peft ours.npz

prints the largest logit difference relative to our largest logit: the merged folder loaded by
``AutoModelForCausalLM.from_pretrained``, ``PeftModel.from_pretrained(base, DIR_peft)``, and the base alone (how
far the adapters moved the model). docs/finetune.md "Checkpoints, resume, export" has the figures.
"""
import json
import sys

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def logits(model, ids):
    with torch.no_grad():
        return model.eval()(ids).logits.numpy()


def main(base, merged, adapter, ours):
    data = np.load(ours)
    ids = torch.tensor(data["ids"].astype(np.int64))
    want = data["logits"]
    scale = np.abs(want).max()
    load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # noqa: E731
    got = {"merged_vs_ours": logits(load(merged), ids),
           "peft_vs_ours": logits(PeftModel.from_pretrained(load(base), adapter), ids),
           "base_vs_ours": logits(load(base), ids)}
    print(json.dumps({k: float(np.abs(v - want).max() / scale) for k, v in got.items()}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
