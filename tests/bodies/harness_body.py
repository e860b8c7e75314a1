"""Worker bodies that exercise the msrun harness itself."""
import os
import time

from mindformers_core.distributed import get_env


def echo(value):
    env = get_env()
    return {"rank": env.rank, "world": env.world_size, "value": value, "pid": os.getpid()}


def fail_on(rank):
    if get_env().rank == rank:
        raise RuntimeError(f"boom from rank {rank}")
    return "ok"


def hang_on(rank, marker):
    """Rank ``rank`` never returns; the process title carries ``marker`` for the orphan check."""
    with open(os.path.join(marker, f"pid_{get_env().rank}"), "w") as f:
        f.write(str(os.getpid()))
    if get_env().rank == rank:
        while True:
            time.sleep(1)
    return "ok"
