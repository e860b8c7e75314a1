"""Worker side of the checkpoint msrun test: each of 4 ranks saves its dp2 x tp2 shards of a few
tensors (plus optimizer moments and its data-iterator position) with the real comm barrier."""
import numpy as np

from mindformers_core.checkpoint import save_checkpoint
from mindformers_core.distributed import get_env
from mindformers_core.sharding import Layout


def expected_globals():
    rng = np.random.default_rng(42)
    return {"embedding.weight": rng.standard_normal((16, 8)).astype(np.float32),
            "attention.wq": rng.standard_normal((8, 12)).astype(np.float32),
            "attention.wo": rng.standard_normal((12, 8)).astype(np.float32),
            "norm.weight": rng.standard_normal((8,)).astype(np.float32)}


def layouts():
    mesh = Layout((2, 2), ("dp", "tp"))
    return {"embedding.weight": mesh(("dp", "tp"), "None"), "attention.wq": mesh("None", "tp"),
            "attention.wo": mesh("tp", "None"), "norm.weight": None}


def run(directory, step):
    env = get_env()
    lay = layouts()
    params = {n: (v if lay[n] is None else v[lay[n].local_slice(v.shape, env.rank)])
              for n, v in expected_globals().items()}
    path = save_checkpoint(directory, step, params, lay, optimizer_state={"exp_avg": {n: -p for n, p in params.items()}},
                           data_state={"rank": env.rank, "consumed": 64}, trainer_state={"step": step, "seed": 1234})
    return {"rank": env.rank, "world": env.world_size, "path": path}
