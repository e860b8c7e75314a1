"""LoRA on one process, from the Qwen3 fixture folder (saved by transformers): only the adapters train (the base
weights stay bitwise the folder's, they have no gradient and no AdamW moments, the checkpoint holds adapters
only), the loss goes down, a resume from an adapter checkpoint (base weights from pretrained_model_dir) is
exact, the merged Hugging Face export equals our base + adapter, the PEFT adapter folder has peft's layout;
both dialects' spellings; bad settings named. No torch / transformers / peft here (checked once by hand,
docs/finetune.md "LoRA")."""
import json
import os

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.peft import LoraConfigError, parse_lora
from mindformers_core.peft.config import matches
from tests.test_trainer import build_assets, config_of, records

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "qwen3")
TARGETS = ".*q_proj|.*v_proj|.*o_proj|.*down_proj"
PET = {"pet_type": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": TARGETS}
RUN = ["--lr_schedule.warmup_steps", 0, "--lr_schedule.total_steps", 4, "--optimizer.learning_rate", 0.05,
       "--lr_schedule.learning_rate", 0.05]
SAVE2 = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 2}]"]


def lora_yaml(root: str, pet=PET, folder=FOLDER) -> str:
    assets = build_assets(os.path.join(root, "assets"))
    with open(assets["yaml"]) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": 32, **({"pet_config": pet} if pet else {})}}
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = folder
    raw["train_dataset"].pop("tokenizer_file", None)
    path = os.path.join(root, "lora.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def argv(config, out, *extra):
    return ["--config", config, "--output_dir", str(out), *map(str, extra)]


def losses(out):
    return [r["loss"] for r in records(out)]


def folder_state():
    from mindformers_core.models.hf.folder import open_folder
    from mindformers_core.models.qwen3 import QWEN3_HF
    folder = open_folder(FOLDER)
    with folder.reader() as read:
        return QWEN3_HF.from_hf({n: read(n) for n in folder.tensors})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from mindformers_core.training.trainer import Trainer
    base = tmp_path_factory.mktemp("lora")
    config = lora_yaml(str(base))
    out = {k: base / k for k in ("full", "half")}
    trainer = Trainer(config_of(argv(config, out["full"], "--runner_config.max_steps", 4, *RUN, *SAVE2)))
    trainer.train()
    trainer.export_hf(str(base / "merged"))
    assert run_mindformer.main(argv(config, out["half"], "--runner_config.max_steps", 2, *RUN, *SAVE2)) == 0
    assert run_mindformer.main(argv(config, out["half"], "--runner_config.max_steps", 4, *RUN, *SAVE2,
                                    "--resume_training", out["half"] / "checkpoint")) == 0
    return dict(out, trainer=trainer, config=config, merged=base / "merged", peft=base / "merged_peft")


def test_only_adapters_train_and_the_base_stays_bitwise(runs):
    trainer = runs["trainer"]
    names = [p.name for p in trainer.params]
    assert names and all(n.endswith((".lora_a.weight", ".lora_b.weight")) for n in names)
    assert len(names) == 2 * 4 * 2                                 # 2 layers x 4 linears x (A, B)
    assert len(trainer.optimizer.moment1) == len(names)            # AdamW state for the adapters only
    want = folder_state()
    frozen = [p for c in trainer.built.chunks for p in c.get_parameters() if not p.requires_grad]
    assert len(frozen) == len(want)
    for p in frozen:
        assert np.array_equal(p.asnumpy(), want[p.name]), p.name
    b = [p for p in trainer.params if p.name.endswith("lora_b.weight")]
    assert all(np.abs(p.asnumpy()).max() > 0 for p in b)          # B left zero, it trained
    got = losses(runs["full"])
    assert len(got) == 4 and got[-1] < got[0]


def test_adapter_checkpoint_is_small_and_resume_is_exact(runs):
    from mindformers_core.checkpoint import checkpoint_specs
    specs = checkpoint_specs(str(runs["full"] / "checkpoint"), 4)
    assert sorted(specs) == sorted(p.name for p in runs["trainer"].params)
    assert [r["step"] for r in records(runs["half"])] == [1, 2, 3, 4]
    np.testing.assert_allclose(losses(runs["half"]), losses(runs["full"]), rtol=1e-6)


def test_merged_export_equals_our_base_plus_adapter(runs):
    import mindspore as ms
    from mindformers_core.models.hf.pretrained import from_pretrained
    ref = np.load(os.path.join(FOLDER, "reference.npz"))["input_ids"]
    ids = ms.Tensor(np.concatenate([ref, ref[:, ::-1]], 1).astype(np.int32))     # the run's seq_length 32
    trainer = runs["trainer"]
    model = trainer.built.model
    model.set_train(False)
    ours = model(ids).asnumpy()
    merged = from_pretrained(str(runs["merged"]), seq_length=ids.shape[1])(ids).asnumpy()
    base = from_pretrained(FOLDER, seq_length=ids.shape[1])(ids).asnumpy()
    scale = np.abs(ours).max()
    assert np.abs(merged - ours).max() / scale < 1e-5
    assert np.abs(base - ours).max() / scale > 1e-2               # the adapters changed the model


def test_peft_adapter_folder_layout(runs):
    from safetensors.numpy import load_file
    tensors = load_file(str(runs["peft"] / "adapter_model.safetensors"))
    with open(runs["peft"] / "adapter_config.json") as f:
        config = json.load(f)
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]
    assert len(tensors) == 16
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a.shape == (4, 32) and b.shape == (32, 4)               # (r, in), (out, r) as torch's Linear (hidden 32)
    ours = {p.name: p.asnumpy() for p in runs["trainer"].params}
    assert np.array_equal(a, ours["decoder.layers.0.self_attention.linear_q.lora_a.weight"].T)


def test_both_spellings_and_names():
    graph = parse_lora(PET, "model.model_config.pet_config")
    pynative = parse_lora({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]})
    assert (graph.rank, graph.alpha, graph.scaling) == (pynative.rank, pynative.alpha, 2.0)
    for name in ("decoder.layers.1.self_attention.linear_q", "decoder.layers.0.mlp.linear_fc2"):
        assert matches(graph, name) and matches(pynative, name)
    assert not matches(graph, "decoder.layers.0.self_attention.linear_k")
    mf = parse_lora({"lora_rank": 8, "target_modules": ".*wq|.*wk"})     # MindFormers' Llama names
    assert matches(mf, "decoder.layers.3.self_attention.linear_k") and not matches(mf, "decoder.layers.3.mlp.linear_fc2")
    from mindformers_core.training.dialects import translate
    out, _, errors = translate({"training": {"steps": 1}, "lora_config": {"r": 4, "target_modules": ["q_proj"]}},
                               1, "pynative")
    assert not errors and out["model"]["model_config"]["pet_config"]["r"] == 4


@pytest.mark.parametrize("pet, message", [
    ({"lora_rank": 0, "target_modules": "q_proj"}, "lora_rank = 0: must be an integer >= 1"),
    ({"lora_rank": 4, "lora_dropout": 1.5, "target_modules": "q_proj"}, "lora_dropout = 1.5: must be in [0, 1)"),
    ({"lora_rank": 4}, "target_modules = None: name the layers to adapt"),
    ({"pet_type": "prefix", "target_modules": "q_proj"}, "pet_type = 'prefix': only 'lora'"),
    ({"lora_rank": 4, "lora_rnak": 2, "target_modules": "q_proj"}, "lora_rnak = 2: unknown LoRA key"),
])
def test_bad_settings_are_named(pet, message):
    with pytest.raises(LoraConfigError, match=None) as e:
        parse_lora(pet, "model.model_config.pet_config")
    assert message in str(e.value)


@pytest.mark.parametrize("extra, message", [
    (["--model.model_config.pet_config", "{lora_rank: 4, target_modules: '.*nothing_here'}"],
     "target_modules = ['.*nothing_here']: matches no layer of this model"),
])
def test_bad_runs_exit_2_naming_the_key(tmp_path, capsys, extra, message):
    config = lora_yaml(str(tmp_path))
    assert run_mindformer.main(argv(config, tmp_path / "out", "--runner_config.max_steps", 1, *extra)) == 2
    assert message in capsys.readouterr().err


def test_dropout_on_expert_adapters_is_named(tmp_path, capsys):
    """LoRA on the routed experts folds A @ B into the expert weights (as peft's target_parameters does), where
    no dropout of the input can apply: lora_dropout > 0 with experts in target_modules is refused by name."""
    moe = os.path.join(os.path.dirname(FOLDER), "qwen3_moe")
    config = lora_yaml(str(tmp_path), dict(PET, lora_dropout=0.1, target_modules=".*experts.gate_proj"), folder=moe)
    assert run_mindformer.main(argv(config, tmp_path / "out", "--runner_config.max_steps", 1)) == 2
    assert "lora_dropout = 0.1: LoRA on the routed experts (decoder.layers.1.mlp.experts.w_gate)" in \
        capsys.readouterr().err


def test_peft_form_of_experts_and_dense_mlp_adapters_is_refused_by_name(tmp_path):
    """peft maps target_modules named gate_proj / up_proj / down_proj of a Qwen3-MoE model onto the experts, so
    adapters on both the experts and a dense layer's MLP have no PEFT form: named (the merged export has them)."""
    from mindformers_core.peft import parse_lora
    from mindformers_core.peft.export import PeftFormatError, write_peft_adapter
    z = np.zeros
    adapters = {"decoder.layers.0.mlp.linear_fc2.lora_a.weight": z((64, 4)),
                "decoder.layers.0.mlp.linear_fc2.lora_b.weight": z((4, 32)),
                "decoder.layers.1.mlp.experts.w_down.lora_a.weight": z((8, 16, 4)),
                "decoder.layers.1.mlp.experts.w_down.lora_b.weight": z((8, 4, 32))}
    names = {"decoder.layers.0.mlp.linear_fc2.weight": "model.layers.0.mlp.down_proj.weight",
             "decoder.layers.1.mlp.experts.w_down": "model.layers.1.mlp.experts.0.down_proj.weight"}
    with pytest.raises(PeftFormatError, match=r"dense MLP linears named \['down_proj'\] has no PEFT form"):
        write_peft_adapter(str(tmp_path / "peft"), adapters, parse_lora(PET), names.__getitem__)
    assert not (tmp_path / "peft").exists()


PIPE = ["--use_parallel", True, "--parallel_config.pipeline_stage", 2, "--check_config", "--worker_num", 2]
DUALPIPEV = ["--parallel_config.micro_batch_num", 4, "--runner_config.batch_size", 1,
             "--parallel.pipeline_config.pipeline_scheduler", "dualpipev", "--parallel.pipeline_config.pipeline_interleave",
             2, "--parallel.pipeline_config.layers_per_stage"]


@pytest.mark.parametrize("extra, message", [
    # DualPipeV's V puts model stages 0 and 3 on rank 0: with [0, 1, 1, 0] it holds no decoder layer
    ([*DUALPIPEV, "[0, 1, 1, 0]"], "with parallel_config.pipeline_stage = 2 and parallel.pipeline_config."
     "layers_per_stage = [0, 1, 1, 0]: pipeline rank 0 runs model stage(s) 0 (layers none), 3 (layers none), where "
     "LoRA adapts no layer, so that rank would have nothing to train"),
    (["--parallel_config.micro_batch_num", 2, "--model.model_config.pet_config",
      "{lora_rank: 4, target_modules: 'model.layers.1.self_attn.q_proj'}"],
     "pipeline rank 0 runs model stage(s) 0 (layers [0]), where LoRA adapts no layer"),
    (["--parallel_config.micro_batch_num", 2, "--model.model_config.pet_config",
      "{lora_rank: 4, target_modules: 'model.layers.7.self_attn.q_proj'}"],
     "target_modules = ['model.layers.7.self_attn.q_proj']: matches no layer of this model"),
])
def test_a_pipeline_rank_without_adapters_is_named_before_any_process_group(tmp_path, capsys, extra, message):
    """LoRA trains the adapters only: a pipeline rank whose stages adapt no layer would have nothing to update.
    --check_config runs the preflight only (no process group, no model on a device): the refusal is there."""
    config = lora_yaml(str(tmp_path))
    assert run_mindformer.main(argv(config, tmp_path / "out", *PIPE, *extra)) == 2
    assert message in capsys.readouterr().err


def test_every_pipeline_rank_with_an_adapted_layer_and_hsdp_level3_pass_the_preflight(tmp_path):
    config = lora_yaml(str(tmp_path))
    assert run_mindformer.main(argv(config, tmp_path / "a", *PIPE, *DUALPIPEV, "[0, 1, 0, 1]")) == 0
    assert run_mindformer.main(argv(config, tmp_path / "b", "--use_parallel", True, "--parallel_config.data_parallel",
                                    2, "--parallel.enable_parallel_optimizer", True, "--hsdp.optimizer_level", "level3",
                                    "--check_config", "--worker_num", 2)) == 0


def test_a_measured_pipeline_split_is_checked_the_same_way(tmp_path):
    """``layers_per_stage: auto`` is measured after start-up: the preflight passes it, and build_model checks the
    measured split with the same rule on every rank (here DualPipeV's V with the measured [0, 1, 1, 0])."""
    from mindformers_core.training.model_builder import lora_stage_problems
    from mindformers_core.training.shape import JobShape
    from tests.test_trainer import config_of
    cfg = config_of(argv(lora_yaml(str(tmp_path)), tmp_path / "out", "--use_parallel", True,
                         "--parallel_config.pipeline_stage", 2, *DUALPIPEV, "auto"),
                    worker_num=2)
    shape = JobShape.from_config(cfg)
    assert lora_stage_problems(cfg, shape) == []
    (problem,) = lora_stage_problems(cfg, shape, [0, 1, 1, 0])
    assert "pipeline rank 0 runs model stage(s) 0 (layers none), 3 (layers none), where LoRA adapts no layer" in problem
    assert lora_stage_problems(cfg, shape, [0, 1, 0, 1]) == []


def test_targets_match_global_layer_names_on_a_pipeline_stage():
    """Stage 1 of a pp2 Qwen3 numbers its layer 0 locally; target_modules naming Hugging Face's layer 1 adapts it
    (and the one naming layer 0 adapts nothing there)."""
    from mindformers_core.models.hf.config import read_hf_config
    from mindformers_core.peft import apply_lora
    from mindformers_core.peft.lora import matched_names
    spec, config, _ = read_hf_config(FOLDER)
    mcfg = spec.config_class.from_model_config(dict(config, seq_length=32), dict(pipeline_stage=2))
    stage = spec.model_class(mcfg, pp_rank=1)
    one = parse_lora({"lora_rank": 4, "target_modules": "model.layers.1.self_attn.q_proj"})
    zero = parse_lora({"lora_rank": 4, "target_modules": "model.layers.0.self_attn.q_proj"})
    assert matched_names(stage, zero) == []
    assert apply_lora(stage, one, mcfg) == ["decoder.layers.0.self_attention.linear_q"]     # its local name


def sp_plan(targets):
    """The sharding plan of the Qwen3 fixture at tp2 with sequence parallel, LoRA on ``targets`` (None: none),
    on the fine-tuning batch (position ids as inputs): pure propagation, no process group."""
    from mindformers_core.common.batch import model_args
    from mindformers_core.models.hf.config import read_hf_config
    from mindformers_core.peft import apply_lora
    from mindformers_core.sharding.parallelizer import plan_sharding
    spec, config, _ = read_hf_config(FOLDER)
    mcfg = spec.config_class.from_model_config(dict(config, seq_length=32), dict(model_parallel=2,
                                                                                 use_seq_parallel=True))
    model = spec.model_class(mcfg)
    if targets:
        apply_lora(model, parse_lora({"lora_rank": 4, "target_modules": targets}), mcfg)
    ids = np.zeros((2, 32), np.int32)
    batch = {"input_ids": ids, "labels": ids, "loss_mask": np.ones(ids.shape, np.float32),
             "position_ids": np.tile(np.arange(32, dtype=np.int32), (2, 1)), "segment_ids": np.zeros_like(ids)}
    return plan_sharding(model, mcfg, *model_args(batch))


def test_lora_under_sequence_parallel_gathers_the_attention_input_once_as_full_fine_tuning_does():
    """Issue 42's root cause, on the plan: LoRA's A beside a column-parallel base once kept its input split over
    the sequence (cheaper at that op), so the sequence all-gather was not hoisted to SelfAttention's input, whose
    code reshapes q with x.shape[1] (then half the tokens: [2, 64, 4, 16] against [2, 128, 1, 16] in the user's
    run). Now A shares the base's gather: SelfAttention's input is gathered once, as without LoRA, and A's
    backward marks its complete input gradient partial (no communication) for the one reduce-scatter."""
    full, lora = sp_plan(None), sp_plan(".*q_proj|.*v_proj|.*o_proj|.*down_proj")
    where = "enter of decoder.layers.0.self_attention tensor 0"
    for plan in (full, lora):
        (gather,) = [r for r in plan.redistributions if r.where == where]
        assert [s.kind for s in gather.forward.steps] == ["all_gather"]
        assert [s.kind for s in gather.backward.steps] == ["reduce_scatter"]
    a_enter = [r for r in lora.redistributions if r.where.startswith("enter of decoder.layers.0.self_attention.linear_q")]
    assert [(r.where.split(" tensor")[0].rsplit(".", 1)[1], [s.kind for s in r.forward.steps],
             [s.kind for s in r.backward.steps]) for r in a_enter] == [("lora_a", [], ["zero_partial"])]
    assert lora.bytes_per_step - full.bytes_per_step == 2 * (2 * 1024 + 2 * 1024)   # r-wide: 4 adapters, 2 layers


def test_a_reshape_sized_from_another_tensors_shape_is_checked_against_the_plan():
    """The parallel code reads local shapes: ``s = x.shape[1]`` then ``y.reshape(b, s, -1, 2)`` needs x and y
    split alike along the sequence. A plan that splits them differently is a PlanError naming both (it was a
    wrong shape at run time)."""
    from mindspore import Parameter, Tensor, nn, ops
    from mindformers_core.sharding.layout import Layout
    from mindformers_core.sharding.parallelizer import plan_sharding
    from mindformers_core.sharding.propagation import PlanError
    mesh = Layout((1, 1, 2), ("dp", "cp", "tp"))

    class Column(nn.Cell):
        sharding_op, sharding_params = "linear", ("weight",)

        def __init__(self):
            super().__init__()
            self.weight = Parameter(Tensor(np.ones((8, 8), np.float32)), name="w")

        def sharding_attrs(self):
            return {"transpose_b": False}

        def construct(self, x):
            return ops.matmul(x, self.weight)

        def shard(self, config):
            return None, None, {"weight": mesh("None", "tp")}

    class SequenceSplit(nn.Cell):
        def construct(self, x):
            return x * 2.0

        def shard(self, config):
            return (mesh("None", "tp", "None"),), None, None

    class Reader(nn.Cell):
        def __init__(self):
            super().__init__()
            self.col, self.other = Column(), SequenceSplit()

        def construct(self, x):
            b, s = x.shape[0], x.shape[1]
            return self.col(x).reshape(b, s, -1, 2).sum() + self.other(x).sum()

    class Top(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Reader()

        def construct(self, x):
            return self.inner(x)

    with pytest.raises(PlanError, match=r"reshape in inner: the code reshapes a tensor of global shape \(2, 4, 8\) "
                                        r"to \(2, 4, 4, 2\) with entries read from the shape of tensor enter inner"):
        plan_sharding(Top(), None, np.zeros((2, 4, 8), np.float32), mesh=mesh,
                      input_layouts=[mesh("None", "tp", "None")])


def test_lora_dropout_under_tensor_parallel_is_named_before_any_process_group(tmp_path, capsys):
    config = lora_yaml(str(tmp_path), dict(PET, lora_dropout=0.05))
    assert run_mindformer.main(argv(config, tmp_path / "out", "--use_parallel", True, "--parallel_config.model_parallel",
                                    2, "--check_config", "--worker_num", 2)) == 2
    assert "lora_dropout = 0.05 with parallel_config.model_parallel = 2: each tensor-parallel rank would draw" in \
        capsys.readouterr().err
