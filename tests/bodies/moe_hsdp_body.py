"""Worker side of expert parallelism with hsdp: the MoE GPT of ``moe_body`` (layer 2: 4 experts, top-2,
shared expert, dropless) parallelized with experts over ``ep``, then hsdp (ZeRO level1/2/3) over data
parallel -- dense parameters sharded over the dp shard group, expert parameters over their own
expert-data-parallel group -- trained 2 AdamW steps with global-norm clipping; returns losses, gradient
norms and this rank's full local weights (gathered from the hsdp shards) with their global slices."""
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import get_env
from mindformers_core.hsdp import hsdp
from mindformers_core.optim import AdamW
from mindformers_core.optim.clip import ClipGradNorm
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import parallelize
from mindformers_core.transformer import GPTModel
from tests.bodies.moe_body import batches, make_config

LR = 1e-3
CLIP = 0.5          # below the steps' gradient norms (~1.5): every step clips, so the norm must be global


def _train(step, slicer):
    losses, norms = [], []
    for tokens in batches():
        loss, norm = step(Tensor(slicer(tokens[:, :-1])), Tensor(slicer(tokens[:, 1:])))
        losses.append(float(loss))
        norms.append(float(norm))
    return losses, norms


def reference(modes=("pynative", "jit")):
    """One process: losses, gradient norms and final weights per mode."""
    out = {}
    for mode in modes:
        ms.set_seed(0)
        model = GPTModel(make_config())
        params = model.trainable_params()
        opt, clip = AdamW(params, LR), ClipGradNorm(CLIP)
        grad_fn = ms.value_and_grad(model, None, params)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            grads, norm = clip(grads)
            opt(grads)
            return loss, norm
        losses, norms = _train(ms.jit(step) if mode == "jit" else step, lambda a: a)
        out[mode] = {"losses": losses, "norms": norms, "weights": {p.name: p.asnumpy() for p in params}}
    return out


def run(configs):
    """``configs``: name -> {"dp", "ep", "level", "modes", "shard_size" (default -1)}."""
    rank = get_env().rank
    result = {}
    for name, kw in configs.items():
        kw = dict(kw)
        level, modes, shard_size = kw.pop("level"), kw.pop("modes"), kw.pop("shard_size", -1)
        for mode in modes:
            ms.set_seed(0)
            config = make_config(**kw)
            model = GPTModel(config)
            sample = batches()[0]
            parallelize(model, config, sample[:, :-1], sample[:, 1:])
            layout = sharding_plan_of(model).input_layouts[0]
            shape = sample[:, :-1].shape
            units = ["decoder.layers.*"] if level == "level3" else None
            wrapped = hsdp(model, shard_size=shard_size, threshold=0.5, optimizer_level=level, units=units)
            opt = AdamW(model.trainable_params(), LR)
            train_step = wrapped.train_step(wrapped, opt, mode=mode, max_grad_norm=CLIP)

            def step(x, y):
                loss = train_step(x, y)
                return loss, train_step.grad_norm
            losses, norms = _train(step, lambda a: a[layout.local_slice(shape, rank)])
            full = wrapped.gather_full_params()
            shards = {}
            for p in model.trainable_params():
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (full[p.name], [(s.start, s.stop) for s in sl], global_shape_of(p))
            result[f"{name}/{mode}"] = {"losses": losses, "norms": norms, "shards": shards,
                                        "describe": wrapped.describe(), "collectives": wrapped.collective_count()}
    return result
