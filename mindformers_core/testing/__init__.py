"""Helpers for running code under msrun from tests, benchmarks and demos."""
from .msrun import MsrunError, free_port, run_msrun

__all__ = ["MsrunError", "free_port", "run_msrun"]
