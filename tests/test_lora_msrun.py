"""LoRA under msrun = one process: tp2 in jit (adapters sharded like the linear they adapt: column A replicated /
B split, row A split / B replicated), pp2, dp2 with hsdp level2 (adapter gradients and AdamW state sharded over
dp; dp2 alone is this run without the sharding) on the Qwen3 fixture, and dp2 x ep2 on the Qwen3-MoE fixture
(LoRA on the attention linears and on the routed experts' gate, up and down weights: expert adapters split over
ep like the experts), in PyNative: the losses of a 3-step fine-tune agree to a relative
1e-5 and the adapter weights of the last checkpoint to 1e-4 of their largest magnitude (measured <= 2.4e-5: AdamW
divides by the root of tiny second moments, which lifts rounding differences of near-zero gradients).

The jobs run in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the
one-process references run here. The Qwen3-MoE reference also proves LoRA on the experts on one process: the
frozen expert weights stay bitwise the folder's, the merged Hugging Face export = our base + adapters, and the
PEFT adapter folder holds the experts in peft's fused-parameter form (``target_parameters``; loaded by peft
0.21.2 onto transformers 5.24's model: docs/finetune.md)."""
import functools
import json
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import computed_ahead, job
from tests.test_lora import PET, RUN, argv, lora_yaml, losses
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
SAVE3 = ["--runner_config.max_steps", 3, "--callbacks",
         "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 3}]"]
PAR = ["--use_parallel", "True", "--runner_config.batch_size", 2]
HSDP = [*PAR, "--parallel_config.data_parallel", 2, "--parallel.enable_parallel_optimizer", True, "--hsdp.threshold", 0]
JOBS = {   # name -> (fixture, mode, parallel flags)
    "tp2_jit": ("qwen3", 0, [*PAR, "--parallel_config.model_parallel", 2, "--runner_config.batch_size", 4]),
    "pp2_pynative": ("qwen3", 1, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2,
                                  "--parallel_config.micro_batch_num", 2, "--runner_config.batch_size", 2]),
    # hsdp level2: the adapters' gradients and AdamW state sharded over dp (threshold 0: every adapter)
    "dp2_hsdp2_pynative": ("qwen3", 1, [*HSDP, "--hsdp.optimizer_level", "level2"]),
    "ep2_pynative": ("qwen3_moe", 1, [*PAR, "--parallel_config.data_parallel", 2,
                                      "--parallel_config.expert_parallel", 2]),
}
MOE_PET = dict(PET, target_modules=r".*q_proj|.*o_proj|.*experts\.(gate|up|down)_proj")
FIXTURES = {"qwen3": PET, "qwen3_moe": MOE_PET}


def run_many(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn; the exit codes."""
    return [run_mindformer.main(a) for a in argvs]


@functools.lru_cache(maxsize=None)
def plan():
    """The YAMLs, output folders and the workers' argvs (made once per process)."""
    base = tempfile.mkdtemp(prefix="lora_msrun_")
    configs = {}
    for name, pet in FIXTURES.items():
        os.makedirs(os.path.join(base, name))
        configs[name] = lora_yaml(os.path.join(base, name), pet, folder=os.path.join(HF, name))
    work = [argv(configs[fx], os.path.join(base, name), "--mode", mode, *RUN, *SAVE3, *flags)
            for name, (fx, mode, flags) in JOBS.items()]
    return base, configs, work


TWO = job("lora_tp2_pp2_hsdp_ep2", 2, "tests.test_lora_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=900,
          group=__name__)


def adapters(out):
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    root = os.path.join(str(out), "checkpoint")
    return load_checkpoint(root, checkpoint_specs(root, 3), rank=0, step=3)


@computed_ahead
def one_process():
    """The one-process runs into plan()'s p1_* folders; the Qwen3-MoE one's Trainer (its merged export made)."""
    from pathlib import Path
    from mindformers_core.training.trainer import Trainer
    from tests.test_trainer import config_of
    base, configs, _ = plan()
    base = Path(base)
    for fx, mode in sorted({(fx, mode) for fx, mode, _ in JOBS.values()} - {("qwen3_moe", 1)}):
        assert run_mindformer.main(argv(configs[fx], base / f"p1_{fx}_{mode}", "--mode", mode, *RUN, *SAVE3)) == 0
    moe = Trainer(config_of(argv(configs["qwen3_moe"], base / "p1_qwen3_moe_1", "--mode", 1, *RUN, *SAVE3)))
    moe.train()
    moe.export_hf(str(base / "moe_merged"))
    return base, moe


@pytest.fixture(scope="module")
def runs():
    base, moe = one_process()
    assert TWO.results() == [[0] * len(plan()[2])] * 2
    return base, moe


@pytest.fixture(scope="module")
def out(runs):
    return runs[0]


@pytest.mark.parametrize("job", sorted(JOBS))
def test_lora_on_workers_equals_one_process(out, job):
    fx, mode, _ = JOBS[job]
    one = out / f"p1_{fx}_{mode}"
    got, want = losses(out / job), losses(one)
    assert len(want) == 3 and all(np.isfinite(want))
    assert_close(got, want)
    a, b = adapters(out / job), adapters(one)
    assert sorted(a) == sorted(b) and all(k.endswith((".lora_a.weight", ".lora_b.weight")) for k in a)
    for k in a:
        scale = np.abs(b[k]).max()
        assert np.abs(a[k] - b[k]).max() <= 1e-4 * scale, k     # measured <= 2.4e-5 (AdamW on near-zero grads)


EXPERTS = [f"decoder.layers.{i}.mlp.experts.{w}" for i in (1, 2) for w in ("w_gate", "w_up", "w_down")]


def test_lora_on_experts_trains_adapters_only(runs):
    """The experts' adapters (A (E, in, r), B (E, r, out)) trained; the expert weights stay the folder's."""
    from mindformers_core.models.hf.folder import open_folder
    from mindformers_core.models.qwen3_moe import QWEN3_MOE_HF
    out, moe = runs
    trained = {p.name: p.asnumpy() for p in moe.params}
    for name in EXPERTS:
        a, b = trained[name + ".lora_a.weight"], trained[name + ".lora_b.weight"]
        assert a.shape[0] == b.shape[0] == 8 and a.shape[2] == b.shape[1] == 4, name
        assert np.abs(b).max() > 0, name                                   # B left zero: it trained
    folder = open_folder(os.path.join(HF, "qwen3_moe"))
    with folder.reader() as read:
        want = QWEN3_MOE_HF.from_hf({n: read(n) for n in folder.tensors})
    frozen = {p.name: p for c in moe.built.chunks for p in c.get_parameters() if not p.requires_grad}
    for name in EXPERTS:
        assert np.array_equal(frozen[name].asnumpy(), want[name]), name
    assert sorted(adapters(out / "ep2_pynative")) == sorted(adapters(out / "p1_qwen3_moe_1"))   # experts in ep2 too


def test_merged_export_of_expert_adapters_equals_our_model(runs):
    import mindspore as ms
    from mindformers_core.models.hf.pretrained import from_pretrained
    out, moe = runs
    ref = np.load(os.path.join(HF, "qwen3_moe", "reference.npz"))["input_ids"]
    ids = ms.Tensor(np.concatenate([ref, ref[:, ::-1]], 1).astype(np.int32))
    model = moe.built.model
    model.set_train(False)
    ours = model(ids).asnumpy()
    merged = from_pretrained(str(out / "moe_merged"), seq_length=ids.shape[1])(ids).asnumpy()
    base = from_pretrained(os.path.join(HF, "qwen3_moe"), seq_length=ids.shape[1])(ids).asnumpy()
    scale = np.abs(ours).max()
    assert np.abs(merged - ours).max() / scale < 1e-5
    assert np.abs(base - ours).max() / scale > 1e-2


def test_peft_adapter_holds_the_experts_as_fused_parameters(runs):
    """transformers 5 fuses a layer's experts into gate_up_proj (E, 2f, h) and down_proj (E, h, f); peft adapts
    them with target_parameters: lora_A (r E, in), lora_B (out, r E); gate and up share one adapter, ours are two
    (rank 2r side by side, rank_pattern / alpha_pattern keep alpha / r). Expert e's delta is rebuilt here the way
    peft does (its get_delta_weight) and compared with ours."""
    from safetensors.numpy import load_file
    out, moe = runs
    folder = out / "moe_merged_peft"
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    with open(folder / "adapter_config.json") as f:
        config = json.load(f)
    assert config["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert sorted(config["target_modules"]) == ["o_proj", "q_proj"]
    assert config["rank_pattern"] == {"mlp.experts.gate_up_proj": 8}
    assert config["alpha_pattern"] == {"mlp.experts.gate_up_proj": 16.0}
    trained = {p.name: p.asnumpy().astype(np.float64) for p in moe.params}
    prefix = "base_model.model.model.layers.1.mlp.experts"
    for key, parts, rank in (("base_layer", ("w_gate", "w_up"), 8), ("", ("w_down",), 4)):
        a = tensors[f"{prefix}{'.' + key if key else ''}.lora_A.weight"].astype(np.float64)
        b = tensors[f"{prefix}{'.' + key if key else ''}.lora_B.weight"].astype(np.float64)
        E = 8
        a3 = a.reshape(E, rank, a.shape[-1])                               # (experts, rank, in)
        b3 = b.reshape(b.shape[0], rank, E)                                # (out, rank, experts)
        delta = np.einsum("ore,eri->eoi", b3, a3) * (8 / 4)                # (E, out, in): alpha / r
        ours = np.concatenate([np.matmul(trained[f"decoder.layers.1.mlp.experts.{w}.lora_a.weight"],
                                         trained[f"decoder.layers.1.mlp.experts.{w}.lora_b.weight"]).transpose(0, 2, 1)
                               for w in parts], axis=1) * 2.0
        np.testing.assert_allclose(delta, ours, rtol=0, atol=1e-6 * np.abs(ours).max())
