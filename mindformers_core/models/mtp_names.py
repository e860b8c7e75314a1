"""Hugging Face names of the multi-token prediction layers (``transformer/mtp.py``), as DeepSeek's checkpoints
store them: the MTP layer after a model of ``num_hidden_layers`` layers is ``model.layers.{num_hidden_layers}``
(then ``+ 1``, ... for more depths), holding ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``, the usual
layer weights, and copies of the embedding and head (``embed_tokens``, ``shared_head.head``).

Ours are ``mtp.layers.{i}`` with the same global index ``i``, so one row per weight maps them with the family's
own layer table (``mtp.layers.{i}.transformer_layer.<ours>`` <-> ``model.layers.{i}.<hf>``). The embedding and
head copies are not weights of ours (the MTP layers share the main model's): they are ignored when reading, and
not written by an export (``transformers`` drops these layers anyway).
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

from .state_dict import Rule, StackedRule, layer_rules

OURS = "mtp.layers.{i}."
HF = "model.layers.{i}."
# our name inside an MTP layer (outside its transformer layer) -> (Hugging Face name, transposed?)
OWN_MAP = {
    "enorm.weight": ("enorm.weight", False),
    "hnorm.weight": ("hnorm.weight", False),
    "eh_proj.weight": ("eh_proj.weight", True),           # ours (2h, h) = x @ W; Hugging Face's Linear (h, 2h)
    "shared_head_norm.weight": ("shared_head.norm.weight", False),
}
# the shared embedding and head, stored again in every MTP layer of DeepSeek's checkpoints
SHARED_COPIES = (HF + "embed_tokens.weight", HF + "shared_head.head.weight")


def mtp_rules(layer_map: Mapping[str, Tuple[str, bool]],
              expert_map: Optional[Mapping[str, Tuple[str, bool]]] = None) -> List[Rule]:
    """The rows of the MTP layers for a family whose layer table is ``layer_map`` (``{ours inside a layer: (hf
    inside a layer, transposed?)}``) and, for stacked experts, ``expert_map`` (hf names with ``{e}``)."""
    rules: List[Rule] = layer_rules(OURS, HF, OWN_MAP)
    rules += layer_rules(OURS + "transformer_layer.", HF, layer_map)
    rules += [StackedRule(OURS + "transformer_layer." + ours, HF + hf, t) for ours, (hf, t) in (expert_map or {}).items()]
    return rules


__all__ = ["mtp_rules", "SHARED_COPIES", "OWN_MAP"]
