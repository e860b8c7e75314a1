"""Collectives with autograd for PyNative and ms.jit; native kernels or AllReduce-SUM emulation."""
from .capabilities import emulation_forced, force_emulation, is_native
from .exchange import AllToAllExchange, AllToAllV, SlotAllToAll, all_to_all_v, gather_counts
from .functional import (Work, all_gather, all_reduce, all_to_all, barrier, broadcast, clear_cache,
                         irecv, isend, recv, reduce_scatter, send)
from .mappings import (copy_to_region, gather_from_region, gather_from_sequence_parallel_region,
                       reduce_from_region, reduce_scatter_to_sequence_parallel_region,
                       scatter_to_region, scatter_to_sequence_parallel_region)

__all__ = ["AllToAllExchange", "AllToAllV", "SlotAllToAll", "Work", "all_gather", "all_reduce", "all_to_all",
           "all_to_all_v", "barrier", "broadcast", "clear_cache",
           "copy_to_region", "emulation_forced", "force_emulation", "gather_counts", "gather_from_region",
           "gather_from_sequence_parallel_region", "irecv", "is_native", "isend", "recv",
           "reduce_from_region", "reduce_scatter", "reduce_scatter_to_sequence_parallel_region",
           "scatter_to_region", "scatter_to_sequence_parallel_region", "send"]
