"""LoRA under msrun = one process, wherever full fine-tuning works (docs/finetune.md "Where LoRA works").

The user's case first (issue 42): MindFormers' own ``finetune_qwen3.yaml`` (HFDataLoader rows with position ids,
its own ``use_seq_parallel: True``) with LoRA on q/v at tensor parallel 2, under jit, crashed on every rank ("For
'Mul' ... [2, 64, 4, 16] and [2, 128, 1, 16]": the sharding pass left SelfAttention's input sequence-split, because
LoRA's A, beside the base linear, kept it split, and the attention reshapes q with ``x.shape[1]``); it now equals
one process.

Then the cells on the Qwen3 fixture (LoRA on q, v, o and down): tp2 (jit), dp2 with
hsdp level1, level2 and level3 (the adapters' state sharded over dp; level3 also gathers the adapters per unit;
the frozen base stays whole), cp2 Ulysses (tp2 with sequence parallel and cp2 ring: the feature grid's cells), pp2 1F1B and pp2 DualPipeV (jit, layers_per_stage
[0, 1, 0, 1]: each rank holds one adapted layer), and on the Qwen3-MoE fixture dp2 x ep2 with adapters on the
attention and on the routed experts' gate, up and down weights (expert adapters split over ep like the experts;
PyNative and jit: the expert-parallel kernels' graph path). Proof: the losses of a 3-step fine-tune agree to a
relative 1e-5 every step, the merged weights (base + A B alpha / r) of the last checkpoint to 1e-5 of their
largest magnitude, and the adapters alone to 1e-4 (measured <= 5.2e-5: AdamW divides by the root of tiny second
moments, which lifts rounding differences of near-zero gradients).

The jobs run in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the
one-process references run here (one per fixture and mode, shared by the cells). The Qwen3-MoE reference also
proves LoRA on the experts on one process: the frozen expert weights stay bitwise the folder's, the merged
Hugging Face export = our base + adapters, and the PEFT adapter folder holds the experts in peft's
fused-parameter form (``target_parameters``; loaded by peft 0.21.2 onto transformers 5.24's model:
docs/finetune.md)."""
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
TP2 = [*PAR, "--parallel_config.model_parallel", 2, "--runner_config.batch_size", 4]
CP2 = [*PAR, "--parallel_config.context_parallel", 2, "--runner_config.batch_size", 4]
DUALPIPEV = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4,
             "--runner_config.batch_size", 1, "--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
             "--parallel.pipeline_config.pipeline_interleave", 2,
             "--parallel.pipeline_config.layers_per_stage", "[0, 1, 0, 1]"]
EP2 = [*PAR, "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2]
# LoRA at tp2 + SP (jit: the user's run below and lora-qwen3_moe-plain-tp2_sp-jit) and at cp2 ring (PyNative:
# lora-qwen3-packed-cp2_ring-pynative) are the feature grid's cells (tests/test_grid_msrun.py)
JOBS = {   # name -> (fixture, mode, parallel flags); every job takes 4 rows per step, as the references
    "tp2_jit": ("qwen3", 0, TP2),
    "pp2_pynative": ("qwen3", 1, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2,
                                  "--parallel_config.micro_batch_num", 2, "--runner_config.batch_size", 2]),
    "pp2_dualpipev_jit": ("qwen3", 0, DUALPIPEV),
    # hsdp: the adapters' gradients and AdamW state sharded over dp (threshold 0: every adapter); level3 also
    # shards the adapters themselves, gathered per unit (hsdp shards trainable parameters: the base stays whole)
    "dp2_hsdp1_pynative": ("qwen3", 1, [*HSDP, "--hsdp.optimizer_level", "level1"]),
    "dp2_hsdp2_pynative": ("qwen3", 1, [*HSDP, "--hsdp.optimizer_level", "level2"]),
    "dp2_hsdp3_pynative": ("qwen3", 1, [*HSDP, "--hsdp.optimizer_level", "level3"]),
    "cp2_ulysses_pynative": ("qwen3", 1, [*CP2, "--parallel_config.context_parallel_algo", "ulysses"]),
    "ep2_pynative": ("qwen3_moe", 1, EP2),
    "ep2_jit": ("qwen3_moe", 0, EP2),
}
MOE_PET = dict(PET, target_modules=r".*q_proj|.*o_proj|.*experts\.(gate|up|down)_proj")
FIXTURES = {"qwen3": PET, "qwen3_moe": MOE_PET}
# the user's run (issue 42): MindFormers' finetune_qwen3.yaml as it is (its use_seq_parallel: True), paths and sizes
# from the command line, LoRA on q and v, tensor parallel 2, the YAML's own mode (jit)
SFT_YAML = os.path.join(os.path.dirname(HF), "mindformers_configs", "finetune_qwen3.yaml")
SFT_PET = "{pet_type: lora, lora_rank: 4, lora_alpha: 8, lora_dropout: 0.0, target_modules: '.*q_proj|.*v_proj'}"


def sft_argv(out, *extra):
    return [str(a) for a in ["--config", SFT_YAML, "--pretrained_model_dir", os.path.join(HF, "qwen3"), "--load_checkpoint",
            os.path.join(HF, "qwen3"), "--train_dataset.data_loader.path",
            os.path.join(os.path.dirname(HF), "sft", "alpaca_arith.json"), "--output_dir", str(out),
            "--parallel_config.pipeline_stage", 1, "--model.model_config.compute_dtype", "float32",
            "--model.model_config.seq_length", 128, "--runner_config.batch_size", 2, "--lr_schedule.learning_rate",
            1e-2, "--model.model_config.pet_config", SFT_PET, *SAVE3, *extra]]


def run_many(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn; the exit codes."""
    return [run_mindformer.main(a) for a in argvs]


@functools.lru_cache(maxsize=None)
def plan():
    """The YAMLs, output folders and the workers' argvs (made once per process): the cells, then the user's run."""
    base = tempfile.mkdtemp(prefix="lora_msrun_")
    configs = {}
    for name, pet in FIXTURES.items():
        os.makedirs(os.path.join(base, name))
        configs[name] = lora_yaml(os.path.join(base, name), pet, folder=os.path.join(HF, name))
    work = [argv(configs[fx], os.path.join(base, name), "--mode", mode, *RUN, *SAVE3, *flags)
            for name, (fx, mode, flags) in JOBS.items()]
    user = [sft_argv(os.path.join(base, "sft_tp2_sp_jit"), "--use_parallel", "True",
                     "--parallel_config.model_parallel", 2, "--parallel_config.data_parallel", 1)]
    return base, configs, work, user


TWO = job("lora_cells", 2, "tests.test_lora_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=1200,
          group=__name__)
USER = job("lora_sft_tp2_sp", 2, "tests.test_lora_msrun:run_many", lambda: {"argvs": plan()[3]}, timeout=600,
           group=__name__)


def adapters(out):
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    root = os.path.join(str(out), "checkpoint")
    return load_checkpoint(root, checkpoint_specs(root, 3), rank=0, step=3)


@computed_ahead
def one_process():
    """The one-process runs into plan()'s p1_* folders (one per fixture and mode), the user's run in its own
    mode; the Qwen3-MoE PyNative one's Trainer (its merged export made)."""
    from pathlib import Path
    from mindformers_core.training.trainer import Trainer
    from tests.test_trainer import config_of
    base, configs, _, _ = plan()
    base = Path(base)
    for fx, mode in sorted({(fx, mode) for fx, mode, _ in JOBS.values()} - {("qwen3_moe", 1)}):
        assert run_mindformer.main(argv(configs[fx], base / f"p1_{fx}_{mode}", "--mode", mode, *RUN, *SAVE3)) == 0
    assert run_mindformer.main(sft_argv(base / "p1_sft", "--use_parallel", "False", "--parallel_config.model_parallel",
                                        1, "--parallel_config.data_parallel", 1)) == 0
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


@functools.lru_cache(maxsize=None)
def base_weights(fixture):
    """The fixture folder's weights by our names (the frozen base of every run)."""
    from mindformers_core.models.hf.folder import open_folder
    from mindformers_core.models.qwen3 import QWEN3_HF
    from mindformers_core.models.qwen3_moe import QWEN3_MOE_HF
    folder = open_folder(os.path.join(HF, fixture))
    table = {"qwen3": QWEN3_HF, "qwen3_moe": QWEN3_MOE_HF}[fixture]
    with folder.reader() as read:
        return table.from_hf({n: read(n) for n in folder.tensors})


def merged(adapters_, base, scaling=8 / 4):
    """``W + A @ B * alpha / r`` of every adapted weight (linears (in, out), experts (E, in, out))."""
    out = {}
    for key in adapters_:
        if key.endswith(".lora_a.weight"):
            name = key[:-len(".lora_a.weight")]
            weight = base.get(name + ".weight", base.get(name))
            a, b = adapters_[key].astype(np.float64), adapters_[name + ".lora_b.weight"].astype(np.float64)
            out[name] = weight + np.matmul(a, b) * scaling
    return out


def assert_adapters_close(got, want, base):
    """Adapters to 1e-4 of their largest magnitude (measured <= 5.2e-5), merged weights to 1e-5."""
    assert sorted(got) == sorted(want) and all(k.endswith((".lora_a.weight", ".lora_b.weight")) for k in got)
    for k in got:
        assert np.abs(got[k] - want[k]).max() <= 1e-4 * np.abs(want[k]).max(), k
    m_got, m_want = merged(got, base), merged(want, base)
    assert len(m_got) == len(got) // 2
    for k in m_got:
        assert np.abs(m_got[k] - m_want[k]).max() <= 1e-5 * np.abs(m_want[k]).max(), k


@pytest.mark.parametrize("job", sorted(JOBS))
def test_lora_on_workers_equals_one_process(out, job):
    fx, mode, _ = JOBS[job]
    one = out / f"p1_{fx}_{mode}"
    got, want = losses(out / job), losses(one)
    assert len(want) == 3 and all(np.isfinite(want))
    assert_close(got, want)
    assert_adapters_close(adapters(out / job), adapters(one), base_weights(fx))


def test_users_finetune_yaml_with_lora_at_tp2_and_its_sequence_parallel_equals_one_process():
    """Issue 42's crash: finetune_qwen3.yaml (use_seq_parallel: True), LoRA on q/v, tp2, jit."""
    base, _ = one_process()
    assert USER.results() == [[0], [0]]
    from pathlib import Path
    got, want = losses(Path(base) / "sft_tp2_sp_jit"), losses(Path(base) / "p1_sft")
    assert len(want) == 3 and all(np.isfinite(want))
    assert_close(got, want)
    assert_adapters_close(adapters(Path(base) / "sft_tp2_sp_jit"), adapters(Path(base) / "p1_sft"),
                          base_weights("qwen3"))


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
