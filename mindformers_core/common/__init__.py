"""Neutral helpers every layer may use: stage/layer placement (pure Python) and the RNG snapshot.

This package is the bottom of the layering: it imports nothing from mindformers_core.
"""
