"""DeepSeek-V3's MindFormers YAMLs (tests/data/mindformers_configs: the research graph-mode file with ``mtp_depth``,
the configs/deepseek3 one with ``num_nextn_predict_layers``, the PyNative TrainConfig one) read as they are: the
multi-token prediction keys of every dialect land on ``mtp_num_layers`` / ``mtp_loss_scaling_factor``, the keys of
what is not built yet are refused by name; a tiny model trains with MTP from those keys (``mtp_loss`` logged apart,
the loss = the plain model's + mtp_loss at step 1), and MTP with a pipeline is refused before any process group."""
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
    assert keys_of(lines) == sorted(
        ["moe_config.aux_loss_factors", "model.model_config.auto_register", "model.model_config.offset",
         "parallel_config"]), lines           # the MLA sizes are read (transformer/mla.py, DeepseekV3ForCausalLM)
    mc, report = model_keys("research_pretrain_deepseek3_671b.yaml")
    assert mc["rope_theta"] == 10000.0 and mc["num_experts"] == 256 and mc["first_k_dense_replace"] == 3
    assert mc["scoring_func"] == "sigmoid" and mc["moe_router_enable_expert_bias"] is True
    listed = {k for k, _ in report.not_applied}
    assert "model.model_config.return_extra_loss" in listed      # the extra losses always join the loss here


def test_pynative_file_reads_mla_sizes_and_refuses_its_yarn_keys_by_name(capsys):
    code, out, err = run(capsys, "--config", real("pynative_ds3.yaml"), "--check_config")
    text = "\n".join(problems(err))
    assert code == 2
    for k in MLA:                       # read since MLA is built (DeepseekV3ForCausalLM, docs/deepseek_v3.md)
        assert f"model.{k} = " not in text, text
    for k in ("rotary_scaling_factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow"):
        assert f"model.{k} = " in text
    assert "num_nextn_predict_layers" not in text and "mtp_loss_scaling_factor" not in text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.test_trainer import build_assets
    return build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))


def records(out):
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_mtp_with_pipeline_is_refused_before_any_process_group(tiny, capsys):
    code, out, err = run(capsys, "--config", tiny["yaml"], "--check_config", "--worker_num", 2,
                         "--parallel_config.pipeline_stage", 2, "--model.model_config.mtp_depth", 1,
                         "--use_parallel", True, "--parallel_config.micro_batch_num", 2)
    assert code == 2
    assert ("model.model_config.mtp_depth = 1: multi-token prediction with parallel_config.pipeline_stage = 2 is "
            "not implemented") in err, err


def test_tiny_model_trains_with_mtp_from_the_graph_mode_keys(tiny, tmp_path, capsys):
    """mtp_depth / mtp_loss_factor on the command line of the tiny Llama YAML: 2 steps, mtp_loss in every
    record; at step 1 (same weights: drawn by name) loss - mtp_loss = the plain model's loss."""
    common = ["--config", tiny["yaml"], "--runner_config.max_steps", 2, "--lr_schedule.total_steps", 2,
              "--callbacks", "[]"]
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
