"""DeepSeek-V3's MindFormers YAMLs (tests/data/mindformers_configs: the research graph-mode file with ``mtp_depth``,
the configs/deepseek3 one with ``num_nextn_predict_layers``, the PyNative TrainConfig one) read as they are: the
multi-token prediction keys of every dialect land on ``mtp_num_layers`` / ``mtp_loss_scaling_factor``, the keys of
what is not built yet are refused by name; a tiny model trains with MTP from those keys (``mtp_loss`` logged apart,
the loss = the plain model's + mtp_loss at step 1), and MTP with a pipeline split leaving the last stage no layer is
refused before any process group."""
import json
import os

import pytest

from mindformers_core.training import read_yaml
from mindformers_core.training.dialects import translate
from tests.test_mindformers_configs import keys_of, problems, real, run

MLA = ["kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]


def model_keys(name):
    cfg, report, errors = translate(read_yaml(real(name)))
    section = cfg["model"]["model_config"]
    return section, report


@pytest.mark.parametrize("name, depth, factor", [("research_pretrain_deepseek3_671b.yaml", 1, 0.3),
                                                 ("pretrain_deepseek3_671b.yaml", 1, 0.3),
                                                 ("pynative_ds3.yaml", 1, 0.3)])
def test_mtp_keys_of_every_dialect_are_read(name, depth, factor):
    mc, report = model_keys(name)
    assert mc["mtp_num_layers"] == depth and mc["mtp_loss_scaling_factor"] == factor
    origin = report.origin["model.model_config.mtp_num_layers"]
    assert origin.rsplit(".", 1)[1] in ("mtp_depth", "num_nextn_predict_layers")


def test_research_file_names_only_what_is_not_built_or_must_change_here(capsys):
    code, out, err = run(capsys, "--config", real("research_pretrain_deepseek3_671b.yaml"), "--check_config")
    lines = problems(err)
    assert code == 2 and "Traceback" not in err + out
    assert not [line for line in lines if "unknown key" in line], lines
    # the research model's own module; 1024 workers; an offset that counts the MTP layer in the last stage
    # (MindFormers' research split: 61 + 1 layers)
    assert keys_of(lines) == ["model.model_config.auto_register", "model.model_config.offset",
                              "parallel_config"], lines
    mc, report = model_keys("research_pretrain_deepseek3_671b.yaml")
    assert [mc[k] for k in MLA] == [512, 1536, 128, 64, 128]       # read (transformer/mla.py, DeepseekV3ForCausalLM)
    assert mc["rope_theta"] == 10000.0 and mc["num_experts"] == 256 and mc["first_k_dense_replace"] == 3
    assert mc["scoring_func"] == "sigmoid" and mc["moe_router_enable_expert_bias"] is True
    listed = {k for k, _ in report.not_applied}
    assert "model.model_config.return_extra_loss" in listed      # the extra losses always join the loss here
    # its two load-balancing factors: MindFormers' grouped-matmul MoE (MoEV3, use_gmm: True) reads the 'expert'
    # entry of aux_loss_factors; aux_loss_factor (0.05) is the older router's
    assert mc["moe_aux_loss_coeff"] == 0.0001 and "moe_router_load_balancing_type" not in mc
    assert "moe_config.aux_loss_factor" in listed


def test_research_file_factors_without_the_grouped_moe_disagree_by_name():
    raw = read_yaml(real("research_pretrain_deepseek3_671b.yaml"))
    raw["moe_config"]["use_gmm"] = False
    _, _, errors = translate(raw)
    assert [e for e in errors if "aux_loss" in e] == [
        "moe_config.aux_loss_factors = 0.0001: conflicts with moe_config.aux_loss_factor = 0.05; they are the same "
        "setting, give one"], errors


def test_pynative_file_reads_mla_yarn_and_mtp_keys(capsys):
    """The PyNative TrainConfig DeepSeek-V3 file: MLA sizes, the flat YaRN keys (position_embedding_type yarn,
    rotary_scaling_factor, beta_fast/slow, mscale, mscale_all_dim) as one rope_scaling mapping, the MTP keys;
    on CPU only its bfloat16 compute dtype remains to change."""
    mc, report = model_keys("pynative_ds3.yaml")
    assert [mc[k] for k in MLA] == [512, 1536, 128, 64, 192] and mc["multi_latent_attention"] is True
    assert mc["rope_scaling"] == {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1,
                                  "mscale_all_dim": 1, "original_max_position_embeddings": 4096}
    assert report.origin["model.model_config.rope_scaling"] == "model.position_embedding_type"
    code, out, err = run(capsys, "--config", real("pynative_ds3.yaml"), "--check_config")
    assert code == 2 and keys_of(problems(err)) == ["compute_dtype", "model.compute_dtype"], err


def test_pynative_fsdp_strategy_is_hsdp_level3_over_data_parallel():
    """parallelism.data_parallel_shard_strategy optim_grads_params (MindFormers' FSDP: optimizer state, gradients
    and weights sharded over data_parallel_shard) = hsdp level3 when data parallel > 1; listed as not applied at
    data parallel 1; another value named."""
    raw = read_yaml(real("pynative_ds3.yaml"))
    raw["training"]["global_batch_size"] = 8          # local 2 x data parallel 4
    cfg, report, errors = translate(raw, worker_num=4)
    assert not errors and cfg["parallel_config"]["data_parallel"] == 4
    assert cfg["parallel"]["enable_parallel_optimizer"] is True and cfg["hsdp"] == {"optimizer_level": "level3",
                                                                                      "threshold": 0}
    assert report.origin["hsdp.optimizer_level"] == "parallelism.data_parallel_shard_strategy"
    cfg, report, errors = translate(raw, worker_num=1)
    assert not errors and "hsdp" not in cfg and "parallelism.data_parallel_shard_strategy" in {k for k, _ in report.not_applied}
    raw["parallelism"]["data_parallel_shard_strategy"] = "optim"
    _, _, errors = translate(raw, worker_num=4)
    assert errors == ["parallelism.data_parallel_shard_strategy = 'optim': only 'optim_grads_params' (optimizer "
                      "state, gradients and weights sharded over data parallel: hsdp level3) is read here; for "
                      "another split use optim_grads_params or remove the key (plain data parallel)"], errors


@pytest.mark.parametrize("layers, read", [(["0-3"], [4]), ([0, "1-2"], [3]), (["0-3", 5], None), (["2-3"], None),
                                          (["x"], None)])
def test_pynative_full_recompute_layer_is_read_as_the_first_layers(layers, read):
    """recompute.full_recompute_layer (mode full, no pipeline): a range from layer 0 = recompute_config.recompute
    [n] (the first n layers); other selections named."""
    raw = read_yaml(real("pynative_ds3.yaml"))
    raw["recompute"]["full_recompute_layer"] = layers
    cfg, report, errors = translate(raw)
    if read is None:
        assert len(errors) == 1 and errors[0].startswith(f"recompute.full_recompute_layer = {layers!r}: "), errors
    else:
        assert not errors and cfg["recompute_config"]["recompute"] == read
        assert report.origin["recompute_config.recompute"] == "recompute.full_recompute_layer"


@pytest.mark.parametrize("keys, message", [
    ({"rotary_scaling_factor": 4}, "model.rotary_scaling_factor = 4: a YaRN setting, read only with "
                                   "model.position_embedding_type: yarn"),
    ({"position_embedding_type": "yarn"}, "model.position_embedding_type = 'yarn': needs model.rotary_scaling_factor"),
])
def test_flat_yarn_keys_alone_are_named(keys, message):
    raw = read_yaml(real("pynative_ds3.yaml"))
    for k in ("position_embedding_type", "rotary_scaling_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        raw["model"].pop(k)
    raw["model"].update(keys)
    _, _, errors = translate(raw)
    assert any(message in e for e in errors), errors


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.test_trainer import build_assets
    return build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))


def records(out):
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("split, named", [
    (["--model.model_config.offset", "[1, -1]"], "model.model_config.offset = [1, -1]"),
    (["--parallel.pipeline_config.layers_per_stage", "[2, 0]"], "parallel.pipeline_config.layers_per_stage = [2, 0]"),
])
def test_mtp_with_a_split_leaving_the_last_stage_no_layer_is_refused_before_any_process_group(tiny, capsys, split,
                                                                                            named):
    """MTP runs on the last pipeline stage after its layers (MindFormers counts the MTP layers in the last stage's
    share of the split): a split giving that stage none is named by --check_config (no process group)."""
    code, out, err = run(capsys, "--config", tiny["yaml"], "--check_config", "--worker_num", 2,
                         "--parallel_config.pipeline_stage", 2, "--model.model_config.mtp_depth", 1,
                         "--use_parallel", True, "--parallel_config.micro_batch_num", 2, *split)
    assert code == 2
    assert (f"{named} with model.model_config.mtp_depth = 1: the last pipeline stage gets no decoder layer, which "
            "leaves no room for the 1 multi-token prediction depth(s)") in err, err
    code, out, err = run(capsys, "--config", tiny["yaml"], "--check_config", "--worker_num", 2,
                         "--parallel_config.pipeline_stage", 2, "--model.model_config.mtp_depth", 1,
                         "--use_parallel", True, "--parallel_config.micro_batch_num", 2)
    assert code == 0, err


def test_tiny_model_trains_with_mtp_from_the_graph_mode_keys(tiny, tmp_path, capsys):
    """mtp_depth / mtp_loss_factor on the command line of the tiny Llama YAML: 2 steps, mtp_loss in every
    record; at step 1 (same weights: drawn by name) loss - mtp_loss = the plain model's loss."""
    common = ["--config", tiny["yaml"], "--mode", 1, "--runner_config.max_steps", 2, "--lr_schedule.total_steps", 2,
              "--callbacks", "[]"]          # (PyNative: MTP under jit is proven by tests/test_mtp_msrun.py)
    code, _, err = run(capsys, *common, "--output_dir", tmp_path / "mtp", "--model.model_config.mtp_depth", 1,
                       "--model.model_config.mtp_loss_factor", 0.3)
    assert code == 0, err
    code, _, err = run(capsys, *common, "--output_dir", tmp_path / "plain")
    assert code == 0, err
    with_mtp, plain = records(tmp_path / "mtp"), records(tmp_path / "plain")
    assert len(with_mtp) == 2 and all(r["mtp_loss"] > 0 for r in with_mtp)
    assert "mtp_loss" not in plain[0]
    assert abs(with_mtp[0]["loss"] - with_mtp[0]["mtp_loss"] - plain[0]["loss"]) < 1e-5 * plain[0]["loss"]
    # the term is 0.3 x a cross-entropy of an untrained model: about 0.3 x ln(vocab 384) = 1.8
    assert 1.2 < with_mtp[0]["mtp_loss"] < 2.4


from tests.test_megatron_data import megatron  # noqa: E402,F401  (the .bin/.idx fixture)

SHRUNK = ["--use_parallel", False, "--parallel_config.data_parallel", 1, "--parallel_config.model_parallel", 1,
          "--parallel_config.pipeline_stage", 1, "--parallel_config.expert_parallel", 1,
          "--parallel_config.micro_batch_num", 1, "--parallel_config.use_seq_parallel", False,
          "--model.model_config.num_layers", 2, "--model.model_config.hidden_size", 32,
          "--model.model_config.num_heads", 4, "--model.model_config.n_kv_heads", 4,
          "--model.model_config.intermediate_size", 64, "--model.model_config.kv_lora_rank", 16,
          "--model.model_config.q_lora_rank", 24, "--model.model_config.qk_rope_head_dim", 8,
          "--model.model_config.qk_nope_head_dim", 8, "--model.model_config.v_head_dim", 8,
          "--model.model_config.vocab_size", 384, "--model.model_config.seq_length", 32,
          "--model.model_config.max_position_embeddings", 32, "--model.model_config.offset", 0,
          "--model.model_config.compute_dtype", "float32", "--recompute_config.recompute", False,
          "--moe_config.expert_num", 4, "--moe_config.num_experts_chosen", 2, "--moe_config.moe_intermediate_size", 16,
          "--moe_config.first_k_dense_replace", 1, "--runner_config.batch_size", 2, "--runner_config.max_steps", 2,
          "--lr_schedule.learning_rate", 1e-3, "--lr_schedule.total_steps", 2]


def test_shrunk_research_file_trains_2_steps_with_mtp(megatron, tmp_path, capsys):  # noqa: F811
    """MindFormers' research DeepSeek-V3 file (mtp_depth 1, mtp_loss_factor 0.3, MLA sizes, moe_config block with
    sigmoid routing and the expert bias), sizes/data/parallel sizes shrunk on the command line; its research-model
    auto_register lines (a module of the MindFormers tree) are dropped; its load-balancing factor is
    aux_loss_factors' [0.0001] (MoEV3's)."""
    import yaml
    raw = read_yaml(real("research_pretrain_deepseek3_671b.yaml"))
    del raw["model"]["model_config"]["auto_register"], raw["model"]["arch"]["auto_register"]
    path = tmp_path / "deepseek3.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "out"
    code, stdout, err = run(
        capsys, "--config", path, "--output_dir", out, "--mode", 1, *SHRUNK,
        "--train_dataset.data_loader.config.data_path", f"['1', '{megatron['prefix']}']",
        "--train_dataset.tokenizer_file", megatron["tokenizer"])
    assert code == 0, err
    rows = records(out)
    assert len(rows) == 2 and all(4 < r["loss"] < 9 and 1.2 < r["mtp_loss"] < 2.4 for r in rows), rows
    assert all("aux_loss" in r and "expert_load" in r for r in rows)


def test_resume_from_an_mtp_checkpoint_is_exact(tiny, tmp_path, capsys):
    """mtp_depth 1, 4 steps in one go vs 2 steps then a resume for 2: the same losses and mtp_loss bitwise, and the
    checkpoint holds the depth's own weights under their global names (mtp.layers.2.*: 2 layers + depth 1)."""
    from tests.test_trainer import saved
    common = ["--config", tiny["yaml"], "--mode", 1, "--model.model_config.mtp_depth", 1,
              "--lr_schedule.total_steps", 4,
              "--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 2}]"]
    assert run(capsys, *common, "--output_dir", tmp_path / "full", "--runner_config.max_steps", 4)[0] == 0
    assert run(capsys, *common, "--output_dir", tmp_path / "cut", "--runner_config.max_steps", 2)[0] == 0
    assert run(capsys, *common, "--output_dir", tmp_path / "cut", "--runner_config.max_steps", 4,
               "--resume_training", True)[0] == 0
    full, cut = records(tmp_path / "full"), records(tmp_path / "cut")
    assert [r["step"] for r in cut] == [1, 2, 3, 4]
    assert [(r["loss"], r["mtp_loss"]) for r in cut] == [(r["loss"], r["mtp_loss"]) for r in full]
    weights, _, _ = saved(tmp_path / "cut", 2)
    assert {"mtp.layers.2.eh_proj.weight", "mtp.layers.2.transformer_layer.mlp.linear_fc2.weight",
            "output_layer.weight"} <= set(weights)
    assert not [n for n in weights if n.startswith("mtp.") and ("output_layer" in n or "head.weight" in n)]
