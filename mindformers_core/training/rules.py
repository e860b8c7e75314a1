"""Cross-field rules of a config: things no single key's type can express.

They run on the type-checked tree, before any process group exists, so a wrong ``data_parallel``
fails in milliseconds instead of as a hang or shape error on rank 3. Every message has the form
``<key path> = <value>: <rule>``. A rule whose inputs already failed their type check is skipped,
so one bad value gives one error, not a cascade.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set

from ..common.sequence_placement import problems as cp_problems
from .schema import PIPELINE_SCHEDULERS
from .topology import rank_order_problem


def _get(cfg: Dict[str, Any], path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def check_rules(cfg: Dict[str, Any], worker_num: int, bad: Set[str]) -> List[str]:
    """All cross-field errors of ``cfg`` (defaults filled in); ``bad`` holds paths that failed typing."""
    errors: List[str] = []

    def ok(*paths: str) -> bool:
        return not any(p in bad or any(p.startswith(b + ".") for b in bad) for p in paths)

    pc, mc = "parallel_config.", "model.model_config."
    sizes = ("data_parallel", "model_parallel", "context_parallel", "pipeline_stage")
    if ok(*(pc + s for s in sizes)):
        dp, mp, cp, pp = (_get(cfg, pc + s) for s in sizes)
        if dp * mp * cp * pp != worker_num:
            errors.append(f"parallel_config = data_parallel {dp} x model_parallel {mp} x context_parallel {cp} "
                          f"x pipeline_stage {pp} = {dp * mp * cp * pp}: must equal the worker count "
                          f"{worker_num} (msrun --worker_num)")
    if ok(pc + "rank_order", *(pc + s for s in sizes)):
        order = _get(cfg, pc + "rank_order")
        problem = rank_order_problem(order, {"dp": _get(cfg, pc + "data_parallel"),
                                             "tp": _get(cfg, pc + "model_parallel"),
                                             "cp": _get(cfg, pc + "context_parallel"),
                                             "pp": _get(cfg, pc + "pipeline_stage")})
        if problem:
            errors.append(f"parallel_config.rank_order = {order!r}: {problem}")
    from .predict import parallel_problems, yaml_problems
    if ok("model"):
        errors += [e for e in yaml_problems(_get(cfg, "model.model_config")) if ok(e.split(" = ")[0])]
    if ok("run_mode", pc + "data_parallel", pc + "pipeline_stage") and cfg["run_mode"] == "predict":
        errors += parallel_problems(_get(cfg, pc + "data_parallel"), _get(cfg, pc + "pipeline_stage"),
                                    cfg["parallel_config"].get("expert_parallel") or 1)
    if ok("use_parallel") and worker_num > 1 and not cfg["use_parallel"]:
        errors.append(f"use_parallel = False: must be True when running on {worker_num} workers")

    if ok(pc + "micro_batch_num", pc + "pipeline_stage"):
        pp, mbn = _get(cfg, pc + "pipeline_stage"), _get(cfg, pc + "micro_batch_num")
        if pp > 1 and mbn < pp:
            errors.append(f"parallel_config.micro_batch_num = {mbn}: must be >= parallel_config.pipeline_stage "
                          f"({pp}) when pipeline_stage > 1, or the pipeline never fills")

    pcfg = "parallel.pipeline_config."
    if ok(pcfg + "pipeline_interleave", pcfg + "pipeline_scheduler"):
        vpp, sched = _get(cfg, pcfg + "pipeline_interleave"), _get(cfg, pcfg + "pipeline_scheduler")
        need, fits = {"interleaved": ("> 1", vpp > 1), "zbv": ("== 2", vpp == 2),
                      "dualpipev": ("== 2", vpp == 2)}.get(sched, ("== 1", vpp == 1))
        if not fits:
            errors.append(f"parallel.pipeline_config.pipeline_interleave = {vpp}: scheduler {sched!r} needs "
                          f"pipeline_interleave {need} (schedulers: {list(PIPELINE_SCHEDULERS)})")

    if ok(pcfg + "pipeline_scheduler", pc + "pipeline_stage", pc + "micro_batch_num", "parallel",
          mc + "num_experts", pc + "expert_parallel") \
            and _get(cfg, pcfg + "pipeline_scheduler") == "dualpipe" and _get(cfg, pc + "pipeline_stage") > 1:
        errors += _dualpipe(cfg)

    if ok(mc + "num_layers", pc + "pipeline_stage", pcfg + "pipeline_interleave", pcfg + "layers_per_stage",
          mc + "offset"):
        errors += _layer_split(cfg)

    if ok(mc + "num_heads", pc + "model_parallel"):
        heads, mp = _get(cfg, mc + "num_heads"), _get(cfg, pc + "model_parallel")
        if heads % mp:
            errors.append(f"model.model_config.num_heads = {heads}: must be divisible by "
                          f"parallel_config.model_parallel = {mp} (each tensor-parallel rank holds whole heads)")
    if ok(mc + "n_kv_heads", mc + "num_query_groups", mc + "num_heads", pc + "model_parallel"):
        errors += _kv_heads(cfg)
    if ok(mc + "hidden_size", mc + "num_heads"):
        hidden, heads = _get(cfg, mc + "hidden_size"), _get(cfg, mc + "num_heads")
        if hidden % heads and not _get(cfg, mc + "head_dim"):
            errors.append(f"model.model_config.hidden_size = {hidden}: must be divisible by "
                          f"model.model_config.num_heads = {heads} (or give model.model_config.head_dim)")
    if ok(mc + "seq_length", pc + "context_parallel", mc + "num_heads", pc + "model_parallel",
          pc + "context_parallel_algo", pc + "context_parallel_method", pc + "ulysses_degree_in_cp",
          pc + "context_parallel_load_balance"):
        errors += _context_parallel(cfg)
    if ok("hsdp.shard_size", pc + "data_parallel"):
        size, dp = _get(cfg, "hsdp.shard_size"), _get(cfg, pc + "data_parallel")
        if size != -1 and (size < 1 or dp % size):
            errors.append(f"hsdp.shard_size = {size}: must be -1 (all data-parallel ranks) or a divisor of "
                          f"parallel_config.data_parallel = {dp}")
    # use_flash_attention: True is accepted (dialects.py lists it once: the same attention computed unfused)
    if ok("optimizer.betas") and len(cfg["optimizer"]["betas"]) != 2:
        errors.append(f"optimizer.betas = {cfg['optimizer']['betas']}: must be two numbers [beta1, beta2]")
    return errors


def _dualpipe(cfg: Dict[str, Any]) -> List[str]:
    """The bidirectional DualPipe (docs/pipeline.md "DualPipe (bidirectional)"): every rank pairs with its
    mirror rank, half the microbatches enter at each end; what the trainer has not tested with it is refused."""
    pc = cfg["parallel_config"]
    p, m = pc["pipeline_stage"], pc["micro_batch_num"]
    where = "with parallel.pipeline_config.pipeline_scheduler = 'dualpipe'"
    errors = []
    if p % 2:
        errors.append(f"parallel_config.pipeline_stage = {p}: must be even {where} (rank r pairs with its mirror "
                      f"rank pipeline_stage-1-r, which holds the other copy of its model stages); use "
                      f"{p + 1}, or dualpipev")
    if m % 2 or m < 2 * p:
        errors.append(f"parallel_config.micro_batch_num = {m}: must be even and >= 2 x pipeline_stage = {2 * p} "
                      f"{where} (half of the microbatches enter at each end, each half fills a pipeline of "
                      f"{p} ranks); use {max(2 * p, m + m % 2)}")
    if cfg["parallel"]["enable_parallel_optimizer"]:
        errors.append(f"parallel.enable_parallel_optimizer = True: not {where}: hsdp's gradient reduction and "
                      "norm do not know DualPipe's two weight copies (each model stage would be counted twice); "
                      "use dualpipev, or enable_parallel_optimizer: False")
    experts = cfg["model"]["model_config"].get("num_experts")
    if (experts or 1) > 1 or (pc.get("expert_parallel") or 1) > 1:
        errors.append(f"model.model_config.num_experts = {experts} (expert_parallel {pc.get('expert_parallel')}): "
                      f"a mixture of experts is not run {where}: its expert load log, aux loss and expert bias "
                      "update do not know the two copies of a stage (untested); use dualpipev")
    return errors


def context_parallel_algorithm(pc: Dict[str, Any]) -> str:
    """``context_parallel_method`` (MindFormers' PyNative name) when set, else ``context_parallel_algo``."""
    return pc.get("context_parallel_method") or pc.get("context_parallel_algo") or "colossal"


def _context_parallel(cfg: Dict[str, Any]) -> List[str]:
    """seq_length divisible by cp (by 2 x cp for the balanced causal ring), heads by the Ulysses degree,
    a valid method and Ulysses degree (see common/sequence_placement.py)."""
    pc, mc = cfg["parallel_config"], cfg["model"]["model_config"]
    where = {"seq_length": "model.model_config.seq_length", "num_attention_heads": "model.model_config.num_heads",
             "ulysses_degree_in_cp": "parallel_config.ulysses_degree_in_cp"}
    method_key = "context_parallel_method" if pc.get("context_parallel_method") else "context_parallel_algo"
    where["context_parallel_algo"] = f"parallel_config.{method_key}"
    heads = mc.get("num_heads")
    return [f"{where[f]} = {v}: " + rule.replace("context_parallel = ", "parallel_config.context_parallel = ")
            for f, v, rule in cp_problems(int(mc["seq_length"]), int(pc["context_parallel"]), int(heads or 1),
                                          int(heads or 1), int(pc["model_parallel"]), context_parallel_algorithm(pc),
                                          pc.get("ulysses_degree_in_cp"), bool(pc["context_parallel_load_balance"]))]


def _kv_heads(cfg: Dict[str, Any]) -> List[str]:
    """GQA: kv heads must split evenly over query heads and over tensor-parallel ranks."""
    mc = cfg["model"]["model_config"]
    mp = cfg["parallel_config"]["model_parallel"]
    n_kv, groups = mc["n_kv_heads"], mc["num_query_groups"]
    if n_kv is not None and groups is not None and n_kv != groups:
        return [f"model.model_config.num_query_groups = {groups}: conflicts with model.model_config.n_kv_heads "
                f"= {n_kv}; they are the same setting, give one"]
    kv, name = (n_kv, "n_kv_heads") if n_kv is not None else (groups, "num_query_groups")
    if kv is None:
        return []
    errors = []
    if mc["num_heads"] % kv:
        errors.append(f"model.model_config.{name} = {kv}: model.model_config.num_heads = {mc['num_heads']} "
                      "must be divisible by it")
    if kv % mp:
        errors.append(f"model.model_config.{name} = {kv}: must be divisible by parallel_config.model_parallel "
                      f"= {mp} (each tensor-parallel rank holds whole kv heads)")
    return errors


def _layer_split(cfg: Dict[str, Any]) -> List[str]:
    """Layers must divide evenly over pp x vpp stages unless an explicit split says otherwise."""
    num_layers = cfg["model"]["model_config"]["num_layers"]
    offset = cfg["model"]["model_config"]["offset"]
    pipe = cfg["parallel"]["pipeline_config"]
    pp, vpp = cfg["parallel_config"]["pipeline_stage"], pipe["pipeline_interleave"]
    stages, explicit = pp * vpp, pipe["layers_per_stage"]
    has_offset = offset != 0 and offset != [0] * len(offset) if isinstance(offset, list) else offset != 0
    where = f"pipeline_stage {pp} x pipeline_interleave {vpp} = {stages} stages"
    if explicit is not None and has_offset:
        return [f"model.model_config.offset = {offset}: give either it or parallel.pipeline_config."
                "layers_per_stage, not both"]
    if isinstance(explicit, str):
        if explicit != "auto":
            return [f"parallel.pipeline_config.layers_per_stage = {explicit!r}: must be a list (layer counts or "
                    "ranges per stage), 'auto' (measure and plan the split) or null (uniform)"]
        return []
    if explicit is not None:
        from ..common.placement import stage_layer_ranges  # the runtime's own splitter, same rules
        placement = "v" if pipe["pipeline_scheduler"] in ("zbv", "dualpipev") else "interleaved"
        try:
            stage_layer_ranges(num_layers, pp, vpp, explicit, placement)
        except (ValueError, TypeError) as exc:
            return [f"parallel.pipeline_config.layers_per_stage = {explicit}: {exc}"]
        return []
    if has_offset:
        offsets = offset if isinstance(offset, list) else [offset] * stages
        counts = [num_layers // stages + o for o in offsets]
        if len(offsets) != stages or min(counts) < 0 or sum(counts) != num_layers:
            return [f"model.model_config.offset = {offset}: needs {stages} numbers ({where}) such that "
                    f"num_layers // {stages} + offset[i] >= 0 and the layers sum to num_layers = {num_layers}"]
        return []
    if num_layers % stages:
        return [f"model.model_config.num_layers = {num_layers}: not divisible by {where}; set "
                "parallel.pipeline_config.layers_per_stage or model.model_config.offset for an uneven split"]
    return []
