"""Hugging Face model folders in and out: the folder (files, safety checks), its config, the weight loader
that reads only the slices a rank holds, and the exporter. Submodules are imported by name."""
