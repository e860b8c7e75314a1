"""MindFormers' own checkpoints in and out: MindSpore ``.ckpt`` / ``.safetensors`` files and MindFormers' unified
folders (``files.py``, ``ckpt.py``), read by slice through MindFormers' names (``names.py``: the legacy Llama /
Qwen2 scheme and the mcore Qwen3 / Qwen3-MoE / DeepSeek-V3 one, with their fused and stacked tensors in
``rules.py``), and written back (``export.py``). Pure Python and NumPy: no MindSpore, no mindformers."""
