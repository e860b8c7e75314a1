"""Packed documents under context parallelism: one packed row holding documents A and B (the boundary inside a
cp chunk) gives the loss and gradients of A and B as two padded rows on one process, at cp2 with the ring
(load-balanced storage order; PyNative and jit) and with Ulysses (PyNative). The position and segment ids reach
the context-parallel kernel as the whole-sequence mask (``ContextParallelAttention(masked=True)``: k/v gathered
over the ring, each local query under its rows of the mask).

Packed rows through the pipeline microbatches of hsdp and of DualPipe: MindFormers' real ``finetune_qwen3.yaml``
(HFDataLoader, Alpaca handler, PackingHandler pack: loss_mask, position_ids, segment_ids) through
``run_mindformer.py``, 2 steps, equals one process with the same 4 rows a step (each step's loss and grad norm to
1e-5, the Hugging Face export at the end to 1e-5 of each tensor's largest magnitude): DualPipeV (jit) and the
bidirectional DualPipe (PyNative) at pp2 with 4 microbatches of a row, and on 4 workers pp2 x dp2 with hsdp level3
(PyNative; level3 under jit: the feature grid's packed hsdp3 cell), 2 microbatches of a row per replica. The microbatches hold different
numbers of unmasked tokens, so the runtime's token weights (``TokenWeights``, counted over dp) matter.

The bodies run in the suite's batched 2-worker (and 4-worker) launches (tests/msrun_batch.py); the one-process
references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

from tests.msrun_batch import computed_ahead, job

pytestmark = pytest.mark.msrun
SEQ, VOCAB = 32, 128
A_LEN = 13          # documents A (13 tokens) and B (19): with cp2's load-balanced chunks of 8 the boundary is
                    # inside storage chunk 1 (tokens 8..15), held by rank 1 next to chunk 2 (tokens 16..23)
MODES = ("pynative", "jit")
# Ulysses in PyNative only: after its exchange it runs the ring's masked path with a ring of one (the jit path of
# that code is the ring's), which keeps the batched launch short
CONFIGS = {"ring_cp2": {"algo": "colossal", "modes": MODES}, "ulysses_cp2": {"algo": "ulysses", "modes": ("pynative",)}}
CASES = [(name, mode) for name, kw in CONFIGS.items() for mode in kw["modes"]]


def make_config(cp=1, algo="colossal"):
    from mindformers_core.transformer import TransformerConfig
    return TransformerConfig(num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                             num_query_groups=2, vocab_size=VOCAB, seq_length=SEQ, context_parallel_size=cp,
                             context_parallel_algo=algo)


def documents():
    """Documents A and B, each (ids, labels, loss mask): the first 3 tokens of each are a prompt (out of the
    loss)."""
    rng = np.random.RandomState(3)
    out = []
    for n in (A_LEN, SEQ - A_LEN):
        tokens = rng.randint(3, VOCAB, n + 1).astype(np.int32)
        mask = np.ones(n, np.float32)
        mask[:3] = 0
        out.append((tokens[:-1], tokens[1:], mask))
    return out


def packed_batch():
    docs = documents()
    return {"input_ids": np.concatenate([d[0] for d in docs])[None],
            "labels": np.concatenate([d[1] for d in docs])[None],
            "loss_mask": np.concatenate([d[2] for d in docs])[None],
            "position_ids": np.concatenate([np.arange(len(d[0])) for d in docs]).astype(np.int32)[None],
            "segment_ids": np.concatenate([np.full(len(d[0]), i) for i, d in enumerate(docs)]).astype(np.int32)[None]}


def padded_batch():
    rows = {k: [] for k in ("input_ids", "labels", "loss_mask")}
    for ids, labels, mask in documents():
        pad = SEQ - len(ids)
        rows["input_ids"].append(np.pad(ids, (0, pad)))
        rows["labels"].append(np.pad(labels, (0, pad)))
        rows["loss_mask"].append(np.pad(mask, (0, pad)))
    return {k: np.stack(v) for k, v in rows.items()}


def _step(model, mode, reducer=None):
    import mindspore as ms
    params = model.trainable_params()
    grad_fn = ms.value_and_grad(model, None, params)

    def step(*batch):
        loss, grads = grad_fn(*batch)
        return loss, (reducer(grads) if reducer is not None else grads)
    return (ms.jit(step) if mode == "jit" else step), params


def reference(mode):
    """One process: A and B as two padded rows."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.common.batch import model_args
    from mindformers_core.transformer import GPTModel
    ms.set_seed(0)
    model = GPTModel(make_config())
    step, params = _step(model, mode)
    loss, grads = step(*model_args(padded_batch(), Tensor))
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}


def run_cp(configs):
    """msrun body: the packed row at cp2, this rank's storage-order slice of every batch key; loss and the
    reduced gradients (whole: no tensor parallelism) per configuration and mode."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.common.batch import model_args
    from mindformers_core.common.sequence_placement import to_storage_order
    from mindformers_core.distributed import get_env
    from mindformers_core.sharding.annotations import sharding_plan_of
    from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
    from mindformers_core.transformer import GPTModel
    rank = get_env().rank
    batch = packed_batch()
    out = {}
    for name, kw in configs.items():
        for mode in kw["modes"]:
            ms.set_seed(0)
            config = make_config(cp=2, algo=kw["algo"])
            model = GPTModel(config)
            parallelize(model, config, *model_args(batch))
            layout = sharding_plan_of(model).input_layouts[0]
            pos = config.token_positions()
            local = {k: to_storage_order(v, pos)[layout.local_slice(v.shape, rank)] for k, v in batch.items()}
            step, params = _step(model, mode, GradientReducer(model.trainable_params()))
            loss, grads = step(*model_args(local, Tensor))
            out[f"{name}/{mode}"] = {"loss": float(loss.asnumpy()),
                                     "grads": {p.name: g.asnumpy() for p, g in zip(params, grads)}}
    return out


CP2 = job("packing_cp2", 2, "tests.test_packing_msrun:run_cp", {"configs": CONFIGS}, timeout=600, group=__name__)


@computed_ahead
def references():
    return {mode: reference(mode) for mode in MODES}


@pytest.fixture(scope="module")
def results():
    return references(), CP2.results()


@pytest.mark.parametrize("name, mode", CASES)
def test_packed_row_at_cp2_equals_the_documents_as_padded_rows(results, name, mode):
    refs, ranks = results
    want_loss, want = refs[mode]
    for got in (r[f"{name}/{mode}"] for r in ranks):
        assert got["loss"] == pytest.approx(want_loss, rel=1e-5)
        assert sorted(got["grads"]) == sorted(want)
        worst = max(float(np.abs(got["grads"][k] - want[k]).max() / (np.abs(want[k]).max() + 1e-12)) for k in want)
        assert worst < 1e-5, worst


def test_the_boundary_is_inside_a_cp_chunk_and_the_documents_differ_from_one():
    """The proof's premise: B starts inside a storage chunk of 8 tokens, and without its segment ids the packed
    row is another loss (the mask is what keeps A and B apart)."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.common.batch import model_args
    from mindformers_core.transformer import GPTModel
    assert A_LEN % (SEQ // 4) != 0
    ms.set_seed(0)
    model = GPTModel(make_config())
    leaky = {k: v for k, v in packed_batch().items() if k != "segment_ids"}
    assert abs(float(model(*model_args(leaky, Tensor)).asnumpy()) - references()["pynative"][0]) > 1e-4


# ---------------------------------------------------------------- the trainer: hsdp and DualPipe microbatches
PP2 = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2]
FOUR_MICRO = [*PP2, "--parallel_config.micro_batch_num", 4, "--runner_config.batch_size", 1]   # a row each
# hsdp on 4 workers: pp2 x dp2, each replica 2 microbatches of a row (the token weights counted over dp)
HSDP = [*PP2, "--parallel_config.data_parallel", 2, "--parallel_config.micro_batch_num", 2,
        "--runner_config.batch_size", 1, "--parallel.enable_parallel_optimizer", "True", "--hsdp.optimizer_level"]
DUALPIPE = [*FOUR_MICRO, "--parallel.pipeline_config.pipeline_scheduler"]
# DualPipeV on the 2-layer fixture: 4 stages, rank 0 the first and last; the YAML's full recompute off (its stage
# map ignores an explicit layers_per_stage: recompute/api.py stage_map)
V = ["--parallel.pipeline_config.pipeline_interleave", 2, "--parallel.pipeline_config.layers_per_stage",
     "[1, 1, 0, 0]", "--recompute_config.recompute", "False"]
PIPELINE_RUNS = {"pp2_dualpipev_jit": (0, [*DUALPIPE, "dualpipev", *V]),
                 "pp2_dualpipe_pynative": (1, [*DUALPIPE, "dualpipe"])}
# pp2 x dp2 with hsdp level3 in PyNative (packed rows through hsdp level3 under jit, without pp: the feature grid's
# full-qwen3-packed-dp2_hsdp3-jit; level2 under a pipeline: tests/test_tied_embeddings_msrun.py's pp2 x dp2 job)
FOUR_RUNS = {"pp2_dp2_hsdp3_pynative": (1, [*HSDP, "level3"])}


@functools.lru_cache(maxsize=None)
def pipeline_plan():
    """Output folders (each with ``<name>_hf``, its export) and the 2-worker argvs (once per process)."""
    from tests.test_sft_msrun import SHORT, argv
    base = tempfile.mkdtemp(prefix="packing_pp_msrun_")
    names = ["one_jit", "one_pynative", *PIPELINE_RUNS, *FOUR_RUNS]
    out = {k: os.path.join(base, k) for name in names for k in (name, f"{name}_hf")}

    def run(name, flag, *extra):
        return argv(out[name], "--mode", flag, *extra, *SHORT, "--export_hf_dir", out[f"{name}_hf"])
    return (out, run, [run(name, flag, *extra) for name, (flag, extra) in PIPELINE_RUNS.items()],
            [run(name, flag, *extra) for name, (flag, extra) in FOUR_RUNS.items()])


PIPELINES = job("packing_pp2_dualpipe", 2, "tests.test_sft_msrun:run_one",
                lambda: {"argvs": pipeline_plan()[2]}, timeout=900, group=__name__)
PIPELINES_HSDP = job("packing_pp2_dp2_hsdp", 4, "tests.test_sft_msrun:run_one",
                     lambda: {"argvs": pipeline_plan()[3]}, timeout=900, group=__name__)


@computed_ahead
def pipeline_references():
    """One process, the same 4 rows a step, jit and PyNative."""
    import run_mindformer
    out, run, _, _ = pipeline_plan()
    for name, flag in (("one_jit", 0), ("one_pynative", 1)):
        assert run_mindformer.main(run(name, flag, "--use_parallel", "False", "--parallel_config.data_parallel", 1,
                                       "--runner_config.batch_size", 4)) == 0


@pytest.fixture(scope="module")
def pipeline_runs():
    out, _, two, four = pipeline_plan()
    pipeline_references()
    assert PIPELINES.results() == [[0] * len(two)] * 2
    assert PIPELINES_HSDP.results() == [[0] * len(four)] * 4
    return out


@pytest.mark.parametrize("name", [*PIPELINE_RUNS, *FOUR_RUNS])
def test_packed_rows_through_hsdp_and_dualpipe_microbatches_equal_one_process(pipeline_runs, name):
    from mindformers_core.models.hf.folder import open_folder
    from tests.test_trainer import records
    from tests.test_trainer_msrun import assert_close
    one, got = records(pipeline_runs[f"one_{name.rsplit('_', 1)[1]}"]), records(pipeline_runs[name])
    assert len(one) == 2 and all(np.isfinite(r["loss"]) for r in one) and one[1]["loss"] < one[0]["loss"]
    for key in ("loss", "grad_norm"):
        assert_close([r[key] for r in got], [r[key] for r in one])
    mode = name.rsplit("_", 1)[1]
    want, have = open_folder(pipeline_runs[f"one_{mode}_hf"]), open_folder(pipeline_runs[f"{name}_hf"])
    assert sorted(have.tensors) == sorted(want.tensors)
    with want.reader() as a, have.reader() as b:
        for tensor in want.tensors:
            expect = a(tensor)
            err = np.abs(b(tensor) - expect).max() / max(np.abs(expect).max(), 1e-12)
            assert err <= 1e-5, f"{name}: {tensor} differs by {err:.2e} of its largest magnitude"


def test_the_pipeline_microbatches_hold_different_token_counts():
    """The premise of the weighting: the 4 microbatches (a packed row each) of a step keep different numbers of
    target tokens (with equal counts a mean of microbatch means would pass too)."""
    import yaml
    from mindformers_core.data import HFTokenizer, build_sft_rows, load_hf_dataset
    from tests.test_sft_msrun import ALPACA, FOLDER, YAML
    with open(YAML) as f:
        chain = yaml.safe_load(f)["train_dataset"]["data_loader"]["handler"]
    rows = build_sft_rows(load_hf_dataset(ALPACA, cache_dir=tempfile.mkdtemp(prefix="packing_rows_")), chain,
                          HFTokenizer(FOLDER), 256)
    counts = [float(np.asarray(r["loss_mask"]).sum()) for r in rows[:4]]
    assert len(set(counts)) > 1, counts
