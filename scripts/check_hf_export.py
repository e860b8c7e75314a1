"""Check a trained run's Hugging Face export against ``transformers`` (run by hand in the throwaway venv of
scripts/make_hf_fixtures.py; the suite never imports torch or transformers).

Inputs: the exported folder (``--export_hf_dir DIR``), the folder the run started from, and an ``.npz`` with
``ids`` (b, s) and our ``logits`` on them (e.g. ``models.hf.pretrained.from_pretrained(DIR)`` run on ``ids``)::

    /tmp/hfvenv/bin/python scripts/check_hf_export.py DIR START ours.npz

prints, relative to our largest logit, the largest difference of ``AutoModelForCausalLM.from_pretrained(DIR)``'s
logits from ours, the same for the starting folder (how far training moved the model), and the tensors of DIR
that transformers did not load (DeepSeek-V3's multi-token prediction layer, which it drops).
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def logits(path, ids):
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    with torch.no_grad():
        return model.eval()(ids).logits.numpy(), info


def main(export, start, ours):
    data = np.load(ours)
    ids = torch.tensor(data["ids"].astype(np.int64))
    want = data["logits"]
    scale = float(np.abs(want).max())
    got, info = logits(export, ids)
    before, _ = logits(start, ids)
    print(json.dumps({"export_vs_ours": float(np.abs(got - want).max()) / scale,
                      "start_vs_ours": float(np.abs(before - want).max()) / scale,
                      "missing_in_export": sorted(info.get("missing_keys", [])),
                      "not_loaded_by_transformers": sorted(info.get("unexpected_keys", []))[:8]}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
