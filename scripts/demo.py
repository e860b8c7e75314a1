"""`make demo`: the foundation running for real on 2 msrun worker processes (CPU).

Prints the Megatron worked example's rank groups, each rank's mesh and groups, and the results
of collectives checked against the expected values (including a backward under ms.jit).
"""
import sys
import time

from mindformers_core.testing import run_msrun


def main() -> int:
    start = time.monotonic()
    print("Launching 2 msrun workers on 127.0.0.1 ...", flush=True)
    results = run_msrun("mindformers_core.examples.foundation:main", 2, timeout=300)
    first = results[0]
    print("\nRankGenerator(tp=2, dp=3, pp=4, order='tp-dp-pp') — the design's worked example")
    print("  DP groups:", first["example_dp_groups"])
    print("  PP groups:", first["example_pp_groups"])
    ok = True
    for r in results:
        print(f"\nrank {r['rank']}/{r['world_size']} backend={r['backend']} {r['mesh']} tp group {r['tp_group']}")
        print(f"  all_reduce(sum)  -> {r['all_reduce']}  {'OK' if r['all_reduce_ok'] else 'WRONG'}")
        print(f"  all_gather(dim0) -> {r['all_gather']}")
        print(f"  jit grad through copy_to_region (all-reduce backward): "
              f"{'OK' if r['jit_grad_ok'] else 'WRONG'} (loss {r['jit_loss']:.1f})")
        ok = ok and r["all_reduce_ok"] and r["jit_grad_ok"]
    print(f"\n{'All checks passed' if ok else 'CHECK FAILED'} in {time.monotonic() - start:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
