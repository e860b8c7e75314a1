"""Worker side of the propagation parity tests: each rank builds the single-process reference and
the same model parallelized only by ``shard()`` declarations, and compares loss and gradients."""
import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import get_env
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from tests.sharding_models import MODELS, plain_plan


def _grad_fn(model):
    params = model.trainable_params()

    def loss(x):
        return model(x)

    return ms.value_and_grad(loss, None, params), params


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def run(models, dp, tp, steps_jit=True):
    rank = get_env().rank
    out = {}
    for name in models:
        ref, shape = MODELS[name.replace("_sp", "") if name.startswith("plain") else name]()
        x = np.random.RandomState(7).standard_normal(shape).astype(np.float32)
        ref_fn, ref_params = _grad_fn(ref)
        ref_loss, ref_grads = ref_fn(Tensor(x))
        ref_grads = {p.name: g.asnumpy() for p, g in zip(ref_params, ref_grads)}

        model, _ = MODELS[name.replace("_sp", "") if name.startswith("plain") else name]()
        plan = None
        if name.startswith("plain"):   # no shard() in the model: styles from outside
            plan = {f"model.{k}": v for k, v in plain_plan(sequence_parallel=name.endswith("_sp")).items()}
        parallelize(model, {"dp": dp, "tp": tp}, x, plan=plan)
        plan = sharding_plan_of(model)
        local_x = x[plan.input_layouts[0].local_slice(shape, rank)]
        fn, params = _grad_fn(model)
        reducer = GradientReducer(params)

        def step(x):
            loss, grads = fn(x)
            return loss, reducer(grads)

        results = {"pynative": step(Tensor(local_x))}
        if steps_jit:
            results["jit"] = ms.jit(step)(Tensor(local_x))
        entry = {"redistributions": len(plan.redistributions), "bytes": plan.bytes_per_step}
        for mode, (loss, grads) in results.items():
            errs = {}
            for p, g in zip(params, grads):
                expect = ref_grads[p.name][layout_of(p).local_slice(global_shape_of(p), rank)]
                errs[p.name] = _rel(g.asnumpy(), expect)
            entry[mode] = {"loss": float(loss), "ref_loss": float(ref_loss),
                           "loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
                           "grad_rel": errs}
        out[name] = entry
    return out
