"""YAML config: safe loading, overrides, schema and cross-field rules, each with its documented message."""
import copy
from pathlib import Path

import pytest
import yaml

from mindformers_core.training import Config, ConfigError, load_config, read_yaml, schema_markdown, validate
from mindformers_core.training.schema import iter_fields

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "llama_tiny.yaml"
RAW = read_yaml(TINY)


def errors_of(changes=None, overrides=(), worker_num=1):
    """The error lines for the tiny config with nested ``changes`` merged in (None = delete the key)."""
    raw = copy.deepcopy(RAW)
    for path, value in (changes or {}).items():
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    with pytest.raises(ConfigError) as info:
        validate(raw, overrides, worker_num)
    return info.value.errors


def test_tiny_yaml_loads_with_types_and_defaults():
    cfg = load_config(TINY)
    assert isinstance(cfg, Config)
    mc = cfg.model.model_config
    assert (mc.num_layers, mc.hidden_size, mc.vocab_size, mc.seq_length) == (4, 128, 1024, 128)
    assert cfg.context.mode == 1 and cfg.context.device_target == "CPU"
    assert isinstance(cfg.optimizer.learning_rate, float)  # `1.e-3` and `1e-5` style both read as floats
    assert cfg.swap_config.default_prefetch == 1  # default filled for a key the file omits
    assert cfg.callbacks[1].type == "CheckpointMonitor" and cfg.callbacks[1].eval_interval == 100
    plain = cfg.to_dict()
    assert type(plain) is dict and type(plain["model"]["model_config"]) is dict
    assert yaml.safe_load(yaml.safe_dump(plain)) == plain  # round-trips through plain YAML
    with pytest.raises(AttributeError, match="did you mean 'parallel_config'"):
        cfg.parallel_confg


def test_tiny_yaml_fits_four_workers_with_overrides():
    cfg = load_config(TINY, ["--use_parallel", "True", "--parallel_config.data_parallel", "2",
                             "--parallel_config.model_parallel", "2"], worker_num=4)
    assert cfg.parallel_config.data_parallel == 2 and cfg.use_parallel is True


def test_override_forms_and_yaml_scalar_parsing(tmp_path):
    cfg = validate(RAW, {"runner_config.batch_size": "8"})
    assert cfg.runner_config.batch_size == 8
    cfg = validate(RAW, ["optimizer.learning_rate=2e-4", ("context.mode", 0), "--swap_config.swap", "true"])
    assert cfg.optimizer.learning_rate == 2e-4 and cfg.context.mode == 0 and cfg.swap_config.swap is True
    # a key the YAML omits but the schema knows is an existing key
    assert validate({"model": RAW["model"]}, ["--hsdp.optimizer_level", "level3"]).hsdp.optimizer_level == "level3"


def test_unknown_override_key_suggests_closest():
    errs = errors_of(overrides=["--parallel_config.data_paralel", "2"])
    assert errs == ["parallel_config.data_paralel = 2: unknown override key; "
                    "did you mean 'parallel_config.data_parallel'?"]
    assert "did you mean 'parallel_config.pipeline_stage'" in errors_of(overrides=["--pipeline_stage", "2"])[0]


def test_override_values_are_type_checked_and_tags_rejected():
    assert errors_of(overrides=["--parallel_config.data_parallel", "'2'"]) == [
        "parallel_config.data_parallel = '2': must be int (got str)"]
    with pytest.raises(ConfigError, match="override --seed.*never Python objects"):
        validate(RAW, ["--seed", "!!python/object/apply:os.getcwd []"])


def test_unsafe_tag_rejected_naming_file(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("seed: 1\nrun_mode: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    msg = str(info.value)
    assert f"{bad}:2" in msg and "python/object/apply:os.system" in msg and "safe_load" in msg


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(tmp_path / "broken.yaml")


def test_parallel_product_must_match_workers():
    assert errors_of({"use_parallel": True, "parallel_config.data_parallel": 2}, worker_num=4) == [
        "parallel_config = data_parallel 2 x model_parallel 1 x context_parallel 1 x pipeline_stage 1 = 2: "
        "must equal the worker count 4 (msrun --worker_num)"]
    assert errors_of({"parallel_config.data_parallel": 2}, worker_num=2) == [
        "use_parallel = False: must be True when running on 2 workers"]


def test_micro_batches_must_fill_pipeline():
    errs = errors_of({"use_parallel": True, "parallel_config.pipeline_stage": 2}, worker_num=2)
    assert errs == ["parallel_config.micro_batch_num = 1: must be >= parallel_config.pipeline_stage (2) when "
                    "pipeline_stage > 1, or the pipeline never fills"]


def test_layers_must_divide_stages_unless_split_given():
    pp2 = {"use_parallel": True, "parallel_config.pipeline_stage": 2, "parallel_config.micro_batch_num": 4,
           "model.model_config.num_layers": 3}
    assert errors_of(pp2, worker_num=2) == [
        "model.model_config.num_layers = 3: not divisible by pipeline_stage 2 x pipeline_interleave 1 = 2 stages; "
        "set parallel.pipeline_config.layers_per_stage or model.model_config.offset for an uneven split"]
    interleaved = dict(pp2, **{"model.model_config.num_layers": 6, "parallel.pipeline_config.pipeline_interleave": 2,
                               "parallel.pipeline_config.pipeline_scheduler": "interleaved"})
    assert "= 4 stages" in errors_of(interleaved, worker_num=2)[0]
    # explicit splits make it valid, and are themselves checked
    validate(copy.deepcopy(RAW), ["--use_parallel", "True", "--parallel_config.pipeline_stage", "2",
                                  "--parallel_config.micro_batch_num", "2", "--model.model_config.num_layers", "3",
                                  "--parallel.pipeline_config.layers_per_stage", "[1, 2]"], worker_num=2)
    validate(copy.deepcopy(RAW), ["--use_parallel", "True", "--parallel_config.pipeline_stage", "2",
                                  "--parallel_config.micro_batch_num", "2", "--model.model_config.num_layers", "3",
                                  "--model.model_config.offset", "[0, 1]"], worker_num=2)
    bad_split = errors_of(dict(pp2, **{"parallel.pipeline_config.layers_per_stage": [1, 1]}), worker_num=2)
    assert bad_split[0].startswith("parallel.pipeline_config.layers_per_stage = [1, 1]: stage split: layer counts")
    bad_offset = errors_of(dict(pp2, **{"model.model_config.offset": [1, 1]}), worker_num=2)
    assert bad_offset[0].startswith("model.model_config.offset = [1, 1]: needs 2 numbers")


def test_scheduler_must_match_interleave():
    assert errors_of({"parallel.pipeline_config.pipeline_scheduler": "zbv"}) == [
        "parallel.pipeline_config.pipeline_interleave = 1: scheduler 'zbv' needs pipeline_interleave == 2 "
        "(schedulers: ['gpipe', '1f1b', 'interleaved', 'zb_h1', 'zbv', 'dualpipev', 'dualpipe'])"]


def test_heads_and_kv_heads_must_divide_model_parallel():
    assert errors_of({"use_parallel": True, "parallel_config.model_parallel": 4,
                      "model.model_config.num_heads": 6, "model.model_config.hidden_size": 96,
                      "model.model_config.n_kv_heads": 6}, worker_num=4) == [
        "model.model_config.num_heads = 6: must be divisible by parallel_config.model_parallel = 4 "
        "(each tensor-parallel rank holds whole heads)",
        "model.model_config.n_kv_heads = 6: must be divisible by parallel_config.model_parallel = 4 "
        "(each tensor-parallel rank holds whole kv heads)"]
    assert errors_of({"use_parallel": True, "parallel_config.model_parallel": 4}, worker_num=4) == [
        "model.model_config.n_kv_heads = 2: must be divisible by parallel_config.model_parallel = 4 "
        "(each tensor-parallel rank holds whole kv heads)"]
    assert errors_of({"model.model_config.num_query_groups": 4}) == [
        "model.model_config.num_query_groups = 4: conflicts with model.model_config.n_kv_heads = 2; "
        "they are the same setting, give one"]
    assert errors_of({"model.model_config.n_kv_heads": 3}) == [
        "model.model_config.n_kv_heads = 3: model.model_config.num_heads = 4 must be divisible by it"]


def test_other_divisibility_rules():
    assert errors_of({"model.model_config.hidden_size": 130}) == [
        "model.model_config.hidden_size = 130: must be divisible by model.model_config.num_heads = 4 (or give "
        "model.model_config.head_dim)"]
    assert errors_of({"use_parallel": True, "parallel_config.context_parallel": 2,
                      "model.model_config.seq_length": 127}, worker_num=2) == [
        "model.model_config.seq_length = 127: must be divisible by parallel_config.context_parallel = 2"]
    assert errors_of({"use_parallel": True, "parallel_config.data_parallel": 4, "hsdp.shard_size": 3},
                     worker_num=4) == [
        "hsdp.shard_size = 3: must be -1 (all data-parallel ranks) or a divisor of parallel_config.data_parallel = 4"]
    assert errors_of({"optimizer.betas": [0.9]}) == ["optimizer.betas = [0.9]: must be two numbers [beta1, beta2]"]


def test_unknown_keys_anywhere_suggest_closest():
    errs = errors_of({"parallel_config.data_paralel": 1, "model.model_config.num_head": 4,
                      "recompute_config.recompte": True, "data_parallel": 1})
    assert errs == [
        "data_parallel = 1: unknown key; did you mean 'parallel_config.data_parallel'?",
        "parallel_config.data_paralel = 1: unknown key; did you mean 'parallel_config.data_parallel'?",
        "recompute_config.recompte = True: unknown key; did you mean 'recompute_config.recompute'?",
        "model.model_config.num_head = 4: unknown key; did you mean 'model.model_config.num_heads'?"]
    cb = copy.deepcopy(RAW)
    cb["callbacks"][0]["per_print_time"] = 2
    with pytest.raises(ConfigError, match=r"callbacks\[0\].per_print_time = 2: unknown key; "
                                          r"did you mean 'callbacks.per_print_times'"):
        validate(cb)


def test_wrong_types_enums_bounds_and_missing():
    assert errors_of({"parallel_config.data_parallel": "2"}) == [
        "parallel_config.data_parallel = '2': must be int (got str)"]
    assert errors_of({"parallel_config.data_parallel": True}) == [
        "parallel_config.data_parallel = True: must be int (got bool)"]
    assert errors_of({"context.device_target": "TPU"}) == [
        "context.device_target = 'TPU': must be one of ['CPU', 'GPU', 'Ascend']"]
    assert errors_of({"run_mode": "evaluate"}) == [
        "run_mode = 'evaluate': must be one of ['train', 'finetune', 'eval', 'predict']"]
    assert errors_of({"hsdp.optimizer_level": "level4"}) == [
        "hsdp.optimizer_level = 'level4': must be one of ['level1', 'level2', 'level3']"]
    assert errors_of({"parallel.pipeline_config.pipeline_scheduler": "seqpipe"}) == [
        "parallel.pipeline_config.pipeline_scheduler = 'seqpipe': MindFormers' sequence-split pipeline schedules "
        "(seq_split_num) are not implemented; must be one of "
        "['gpipe', '1f1b', 'interleaved', 'zb_h1', 'zbv', 'dualpipev', 'dualpipe']"]
    assert errors_of({"runner_config.batch_size": 0}) == ["runner_config.batch_size = 0: must be >= 1"]
    assert errors_of({"model.model_config.vocab_size": None}) == [
        "model.model_config.vocab_size is missing: required (int)"]
    assert errors_of({"context": 5}) == [
        "context = 5: must be a mapping with keys ['mode', 'device_target', 'cpu_threads', 'pynative_synchronize']"]


def test_all_errors_collected_in_one_exception():
    with pytest.raises(ConfigError) as info:
        validate(RAW, ["--parallel_config.data_parallel", "'2'", "--context.mode", "3",
                       "--parallel_config.pipeline_stage", "2", "--model.model_config.num_layers", "3",
                       "--model.model_config.num_heads", "3", "--parallel_config.model_parallel", "2",
                       "--optimizer.typo", "1"], worker_num=4)
    err = info.value
    assert len(err.errors) == 9
    lines = str(err).splitlines()
    assert lines[0] == "9 problem(s) in <dict>:" and len(lines) == 10
    starts = ("optimizer.typo = 1: unknown override key", "parallel_config.data_parallel = '2'",
              "context.mode = 3", "use_parallel = False", "parallel_config.micro_batch_num = 1",
              "model.model_config.num_layers = 3", "model.model_config.num_heads = 3",
              "model.model_config.hidden_size = 128", "model.model_config.n_kv_heads = 2")
    assert sorted(s for s in starts for line in lines[1:] if line.strip().startswith(s)) == sorted(starts)


def test_docs_cover_every_field():
    doc = (ROOT / "docs" / "config.md").read_text()
    assert schema_markdown() in doc, "docs/config.md field tables are stale: paste schema_markdown()"
    for path, _ in iter_fields():
        assert f"`{path}`" in doc
