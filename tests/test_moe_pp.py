"""Mixture of experts split into pipeline stages, on one process: a stage before the last returns
(hidden states, its MoE layers' load-balancing loss) and the runtime keeps that loss term where it was
made (added to the loss it returns, sensitivity 1/m in the backward; nothing travels between stages).
The staged model's loss (CE + every stage's aux loss) and gradients equal one step of the whole model
on the whole batch, PyNative and jit, for DualPipeV's V (two stages on one rank) and interleaved 1F1B."""
import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402

import mindformers_core.pipeline as pp  # noqa: E402
from mindformers_core.pipeline.runtime import PipelineStage  # noqa: E402
from mindformers_core.transformer import GPTModel, TransformerConfig  # noqa: E402

SEQ, VOCAB, BATCH = 8, 64, 4


def make_config(stages=1, balance="seq_aux_loss", groups=1):
    return TransformerConfig(num_layers=4, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2,
                             vocab_size=VOCAB, seq_length=SEQ, num_moe_experts=4, moe_router_topk=2,
                             moe_ffn_hidden_size=12, moe_shared_expert_intermediate_size=8,
                             moe_aux_loss_coeff=0.05, moe_router_load_balancing_type=balance,
                             moe_aux_loss_micro_batches=groups,
                             moe_first_k_dense_layers=1, pipeline_model_parallel_size=stages)


def whole_model_step(tokens, **config):
    ms.set_seed(0)
    model = GPTModel(make_config(**config))
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(model, None, params)(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]))
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}, model


def staged(schedule_class, micro_batch_num, **config):
    """Two stages (layers 0-1: dense + MoE, layers 2-3: MoE + head) on this process."""
    cfg = make_config(stages=2, **config)
    stages, models = [], []
    for s in range(2):
        ms.set_seed(0)
        model = GPTModel(cfg, pp_rank=s)
        models.append(model)
        stages.append(PipelineStage(model, s, 2, loss_in_cell=s == 1))
    return schedule_class(stages, micro_batch_num), stages, models


def global_names(model):
    numbers = model.decoder.layer_numbers
    out = []
    for p in model.trainable_params():
        name = p.name
        for i, n in enumerate(numbers):
            name = name.replace(f"decoder.layers.{i}.", f"decoder.layers.@{n - 1}.")
        out.append(name.replace("@", ""))
    return out


@pytest.mark.parametrize("schedule, mode", [("dualpipev", "pynative"), ("dualpipev", "jit"),
                                            ("interleaved", "pynative")])
def test_moe_stages_match_the_whole_model(schedule, mode):
    rng = np.random.RandomState(5)
    tokens = rng.randint(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    want_loss, want_grads, whole = whole_model_step(tokens)
    cls = {"dualpipev": pp.ScheduleDualPipeV, "interleaved": pp.ScheduleInterleaved1F1B}[schedule]
    sched, stages, models = staged(cls, 2)
    assert models[0].returns_aux and not models[0].post_process   # the first stage holds an aux loss
    loss = sched.run(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]), mode=mode)
    assert stages[0].local_loss_dtype is not None
    # the aux loss is really in the loss: without it the staged CE alone differs
    ce_only = want_loss - sum(float(c.aux_sum.asnumpy()) for _, c in whole.cells_and_names()
                              if type(c).__name__ == "AuxLossProbe")
    assert abs(ce_only - want_loss) > 1e-4
    assert abs(float(loss.asnumpy()) - want_loss) <= 1e-5 * abs(want_loss), (float(loss.asnumpy()), want_loss)
    got = {}
    for model, st in zip(models, stages):
        got.update({n: g.asnumpy() for n, g in zip(global_names(model), st.grads)})
    assert sorted(got) == sorted(want_grads)
    for name, want in want_grads.items():
        err = np.abs(got[name] - want).max() / max(np.abs(want).max(), 1e-12)
        assert err <= 1e-5, f"{name}: gradient differs by {err:.2e}"
    # the router weight of the first stage's MoE layer gets the load-balancing loss's gradient
    router = want_grads["decoder.layers.1.mlp.router.weight"]
    assert np.abs(router).max() > 0


def test_batch_aux_loss_is_per_microbatch_under_pp():
    """``aux_loss`` (f and P over the batch) under a pipeline is taken per microbatch: it equals one process
    with ``moe_aux_loss_micro_batches`` = the microbatch count, and differs from the whole batch's."""
    rng = np.random.RandomState(5)
    tokens = rng.randint(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    want_loss, want_grads, _ = whole_model_step(tokens, balance="aux_loss", groups=2)
    whole_batch_loss = whole_model_step(tokens, balance="aux_loss")[0]
    sched, stages, models = staged(pp.ScheduleInterleaved1F1B, 2, balance="aux_loss")
    loss = float(sched.run(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]), mode="pynative").asnumpy())
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), (loss, want_loss)
    assert abs(whole_batch_loss - want_loss) > 1e-5 * abs(want_loss), (whole_batch_loss, want_loss)
    got = {}
    for model, st in zip(models, stages):
        got.update({n: g.asnumpy() for n, g in zip(global_names(model), st.grads)})
    for name, want in want_grads.items():
        err = np.abs(got[name] - want).max() / max(np.abs(want).max(), 1e-12)
        assert err <= 1e-5, f"{name}: gradient differs by {err:.2e}"


@pytest.mark.parametrize("extra, workers", [
    (["parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=2"], 2),
    (["parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=2", "parallel_config.data_parallel=2",
      "parallel_config.expert_parallel=2"], 4),
    (["parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=4", "parallel_config.data_parallel=2",
      "parallel_config.expert_parallel=2", "parallel.pipeline_config.pipeline_scheduler=dualpipev",
      "parallel.pipeline_config.pipeline_interleave=2", "model.model_config.num_layers=4"], 4)])
def test_moe_with_pipeline_passes_the_preflight(extra, workers, tmp_path):
    """pp x MoE and pp x ep (1F1B, DualPipeV) are no longer refused before the process groups."""
    import os
    from mindformers_core.training import ConfigError, load_config
    from mindformers_core.training.preflight import preflight
    from mindformers_core.training.shape import JobShape
    tiny = os.path.join(os.path.dirname(os.path.dirname(__file__)), "research", "llama", "llama_tiny.yaml")
    cfg = load_config(tiny, ["model.model_config.num_experts=4", "use_parallel=True"] + extra, worker_num=workers)
    try:
        preflight(cfg, JobShape.from_config(cfg), workers, str(tmp_path))
    except ConfigError as e:          # only file checks may complain (no corpus given here)
        assert not [x for x in e.errors if "expert" in x or "pipeline" in x], e.errors


def test_moe_monitor_gathers_the_stages_layers():
    """The trainer's MoE report on a pipeline rank: its stages' MoE layers sit at their global slots (layer 0 is
    dense), the others are zero (filled by the all-reduce from the ranks holding them)."""
    from mindformers_core.training.moe_log import MoEMonitor
    cfg = make_config(stages=2)
    last = GPTModel(cfg, pp_rank=1)                 # layers 2, 3: MoE slots 1, 2 of the MoE layers 1, 2, 3
    monitor = MoEMonitor([last], cfg)
    assert monitor.num_layers == 3 and monitor.slots == [1, 2]
    tokens = np.random.RandomState(0).randint(0, VOCAB, (2, SEQ + 1)).astype(np.int32)
    hidden = Tensor(np.random.RandomState(1).standard_normal((2, SEQ, 16)).astype(np.float32))
    last(hidden, Tensor(tokens[:, 1:]))
    record, text = monitor()
    assert record["expert_load"][0] == [0.0] * 4
    assert [sum(x) for x in record["expert_load"][1:]] == [2 * SEQ * 2] * 2     # every token's 2 choices
    assert record["aux_loss"] > 0 and "aux" in text
