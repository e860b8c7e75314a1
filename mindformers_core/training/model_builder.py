"""The model the config names (``model.arch.type`` from the model registry), or this rank's pipeline
stages of it, sharded over this stage's ranks by the layers' ``shard()`` declarations, with
recompute/swap applied by Cell name.

Plans see global shapes: the sample inputs are one global microbatch. With a pipeline, each stage
chunk's parameters are renamed to their global layer numbers, so names are unique on a rank and a
checkpoint holds one entry per parameter of the whole model.

When a Hugging Face folder's weights are loaded right after the build (``hf_folder``: ``load_checkpoint`` is
one), the weights it holds are not drawn (``transformer.init.deferred_init``): the model is built with them
as zeros, and before it is sharded every other random parameter (LoRA's A, MTP layers the folder lacks) gets
exactly the draw it would have had.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence

import mindspore as ms
import numpy as np

from ..models import get_model_spec
from ..sharding.annotations import sharding_plan_of
from ..sharding.expert_parallel import expert_mesh
from ..sharding.layout import Layout
from ..sharding.parallelizer import parallelize
from ..transformer.init import deferred_init
from ..common.sequence_placement import normalize_algorithm
from .config import Config, ConfigError
from .moe_log import moe_monitor
from .mtp_log import mtp_monitor
from .rules import context_parallel_algorithm
from .shape import JobShape
from .topology import Topology

_LOCAL_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")


@dataclass
class BuiltModel:
    model_config: object        # the TransformerConfig the chunks were built with
    chunks: list                # this rank's stage Cells in model order (one without a pipeline); DualPipe:
                                # the down copy of model stage r, then the up copy of model stage pp-1-r
    params: list                # their trainable parameters, in order
    plan: object                # the first chunk's ShardingPlan
    moe: object = None          # a MoEMonitor (training/moe_log.py) for a mixture-of-experts model
    copies: tuple = ()          # DualPipe: the up copy's parameters (same names as a down copy's elsewhere)
    mtp: object = None          # an MTPMonitor (training/mtp_log.py) for a model with multi-token prediction
    tied: tuple = ()            # names of parameters several model stages hold (the embedding on the first and the
                                # last stage: tied embeddings, MTP); the pipeline sums their gradients
                                # (pipeline/runtime.py _sum_tied)

    @property
    def model(self):
        return self.chunks[0]


def build_model(cfg: Config, shape: JobShape, topo: Topology, micro_batch: int, output_dir: str,
                log=print, hf_folder: Optional[str] = None) -> BuiltModel:
    """``hf_folder``: a Hugging Face folder the caller loads into the model right after (every parameter it
    holds): those are built as zeros, not drawn (the others are drawn as without it)."""
    spec = get_model_spec(cfg.model.arch.type)
    mcfg = model_config_for(spec, cfg, shape)
    held = hf_held(spec, hf_folder)
    if shape.predicting:
        return predict_model(spec, cfg, shape, mcfg, topo, log, held)
    ep = mcfg.expert_model_parallel_size
    if ep > 1:   # experts over ep, carved out of dp: "dp" names ("edp", "ep") (docs/moe.md)
        mesh = expert_mesh(shape.dp, shape.cp, shape.tp, ep, topo.stage_ranks)
    else:
        mesh = Layout((shape.dp, shape.cp, shape.tp), ("dp", "cp", "tp"), topo.stage_ranks)
    seq = int(cfg.model.model_config.seq_length)
    ids = np.zeros((micro_batch * shape.dp, seq), np.int32)
    counts = layer_counts(cfg, topo, output_dir, log) if shape.pp > 1 else None
    lora = lora_settings(cfg, shape)
    if lora is not None and shape.pp > 1 and cfg.parallel.pipeline_config.layers_per_stage == "auto":
        problems = lora_stage_problems(cfg, shape, counts)   # the measured split: every rank decides alike
        if problems:
            raise ConfigError(problems)
    chunks, has_copy = [], False
    for s in topo.stages:
        ms.set_seed(int(cfg.seed))          # every stage starts from the seed: same weights as one process
        if shape.pp == 1:
            with _deferred_if(held) as deferred:
                chunk = spec.model_class(mcfg)
            _apply_lora(lora, chunk, mcfg, topo.rank, log)      # (its adapters are drawn at once, as always)
            _draw_not_held(deferred, chunk, held)               # before sharding: the draws are of full shapes
            parallelize(chunk, mcfg, *batch_samples(cfg, ids), mesh=mesh, rank=topo.rank)
        else:
            # DualPipe: stage index s runs model stage s % pp (its down copy for s < pp, else its up
            # copy), built like any stage: both copies of a model stage have the same parameter names
            k = topo.model_stage(s)
            with _deferred_if(held) as deferred:
                chunk = spec.model_class(mcfg, pp_rank=k % shape.pp,
                                         vp_stage=k // shape.pp if shape.vpp > 1 else None, layers_per_stage=counts)
            _apply_lora(lora, chunk, mcfg, topo.rank, log, require_match=False)   # (lora_stage_problems)
            numbers = chunk.decoder.layer_numbers    # local layer i is global layer numbers[i] - 1
            _draw_not_held(deferred, chunk, held, numbers)
            _parallelize_stage(chunk, mcfg, k, topo, mesh, ids, side=len(batch_samples(cfg, ids)) > 2)
            if getattr(chunk, "embedding_copy", False):   # tied / MTP on the last stage: saved once, by the first
                has_copy = True
            for p in chunk.get_parameters():         # the expert bias (model state in checkpoints) too
                p.name = global_param_name(p.name, numbers)
        _apply_recompute(cfg, chunk, topo.rank, log)
        chunks.append(chunk)
    if has_copy and {0, topo.model_stage_num - 1} <= {topo.model_stage(s) for s in topo.stages}:
        _share_embedding(chunks)
    params = list({id(p): p for chunk in chunks for p in chunk.trainable_params()}.values())   # a shared one once
    moe = moe_monitor(chunks, mcfg)   # pipeline: every rank joins its all-reduce (stages gathered there)
    copies = _copies(chunks, topo)
    tied = ("embedding.word_embeddings.weight",) if shape.pp > 1 and (mcfg.mtp_depths or mcfg.tie_word_embeddings) \
        else ()
    return BuiltModel(mcfg, chunks, params, sharding_plan_of(chunks[0]), moe, copies, mtp_monitor(chunks, mcfg), tied)


def global_param_name(name: str, numbers: Optional[Sequence[int]]) -> str:
    """A pipeline stage's parameter name with its local layer number made global (``numbers``: the stage
    decoder's ``layer_numbers``, 1-based; None: the whole model, unchanged)."""
    if numbers is None:
        return name
    return _LOCAL_LAYER.sub(lambda m: f"decoder.layers.{numbers[int(m.group(1))] - 1}.", name)


def hf_held(spec, folder: Optional[str]):
    """``(the family's state-dict adapter, the folder's tensor names)`` for a build whose weights a Hugging Face
    folder overwrites, or None (no folder, or a family without a Hugging Face table: everything is drawn)."""
    if not folder or spec.state_dict_adapter is None:
        return None
    from ..models.hf.folder import FolderError, open_folder
    try:
        return spec.state_dict_adapter, frozenset(open_folder(folder).tensors)
    except FolderError:             # the load names the problem; until then, draw
        return None


def _deferred_if(held):
    """``deferred_init()`` when the folder's weights follow, else a context yielding None (draw as usual)."""
    return deferred_init() if held is not None else contextlib.nullcontext()


def _draw_not_held(deferred, chunk, held, numbers: Optional[Sequence[int]] = None) -> None:
    """Draw every deferred parameter of ``chunk`` the folder's load will not fill: the ones the trainer's
    checkpointer loads (trainable, or LoRA's frozen base weights) and whose global name the folder holds
    (``from_pretrained``'s test) are left as zeros; the rest (e.g. MTP layers absent from the folder) get
    exactly the draw they would have had (same key and std; ``ms.set_seed`` is that of the build)."""
    if deferred is None:
        return
    from ..models.hf.loader import folder_holds
    from ..peft.lora import FROZEN_ATTR
    adapter, tensors = held
    deferred.materialize(loaded=[p for p in chunk.get_parameters()
                                 if (p.requires_grad or getattr(p, FROZEN_ATTR, False))
                                 and folder_holds(adapter, global_param_name(p.name, numbers), p.shape, tensors)])


def _copies(chunks, topo: Topology) -> tuple:
    """The parameters this rank holds that another holds under the same name and saves: DualPipe's up copies, and
    the last stage's copy of the embedding table (tied output layer, MTP), unless it is the first model stage's own
    Parameter (shared on a rank holding both ends, ``_share_embedding``)."""
    held = [p for chunk, s in zip(chunks, topo.stages) if topo.is_copy(s) for p in chunk.get_parameters()]
    held += [p for chunk in chunks if getattr(chunk, "embedding_copy", False) for p in chunk.embedding.get_parameters()]
    owned = {id(p) for chunk, s in zip(chunks, topo.stages) if not topo.is_copy(s) and topo.model_stage(s) == 0
             for p in chunk.get_parameters()}
    return tuple({id(p): p for p in held if id(p) not in owned}.values())


def _share_embedding(chunks, name: str = "embedding.word_embeddings.weight") -> None:
    """This rank runs the first model stage and the last one too (DualPipeV's V on rank 0; the bidirectional
    DualPipe on its end ranks, one of the two stages being an up copy): the embedding table of the other chunks
    (the last stage's copy for its tied output layer or MTP, or an up copy's own) is the first chunk's Parameter
    itself (one name per rank; the pipeline sums the stages' gradients of it, ``pipeline/runtime.py``
    ``_sum_tied``). Set after all are sharded alike (the same vocab split): the Cells holding the others (the
    sharding pass may have wrapped them) take the first's."""
    shared = next(p for p in chunks[0].get_parameters() if p.name == name)
    for chunk in chunks[1:]:
        copy = next((p for p in chunk.get_parameters() if p.name == name), None)
        if copy is None:
            continue
        if tuple(copy.shape) != tuple(shared.shape):
            raise ValueError(f"{name}: the last stage's copy {tuple(copy.shape)} is sharded unlike the first "
                             f"stage's {tuple(shared.shape)}")
        holders = [(cell, key) for _, cell in chunk.cells_and_names() for key, p in cell._params.items() if p is copy]
        for cell, key in holders:
            setattr(cell, key, shared)
        shared.name = name          # (MindSpore renames a Parameter a new Cell takes)


def predict_model(spec, cfg: Config, shape: JobShape, mcfg, topo: Topology, log=print, held=None) -> BuiltModel:
    """``run_mode: predict``: the whole model on every rank, not sharded for training shapes: the generator
    shards its step (model and KV caches) for the prompts' shapes (tensor parallel, ``Generator(
    parallel_config=model_config)``) after the checkpoint loads the full weights. ``model_config`` keeps the
    job's sizes (sequence parallel off: a training memory split, no change to the tokens). ``held``
    (``hf_held``): the folder whose weights are loaded after, not drawn."""
    ms.set_seed(int(cfg.seed))
    one = replace(mcfg, data_parallel_size=1, tensor_model_parallel_size=1, sequence_parallel=False)
    with _deferred_if(held) as deferred:
        model = spec.model_class(one)
    _apply_lora(lora_settings(cfg, shape), model, one, topo.rank, log)
    _draw_not_held(deferred, model, held)
    return BuiltModel(replace(mcfg, sequence_parallel=False), [model], list(model.trainable_params()),
                      sharding_plan_of(model))


def batch_samples(cfg: Config, ids: np.ndarray) -> tuple:
    """Sample model arguments in ``common/batch.py`` order for the keys the data feeds: (ids, labels) for
    pretraining data; with HFDataLoader also loss_mask / position_ids / segment_ids, so that the plan splits
    them like the batch and reduces the masked mean's token count over dp (the loss is the mean over the
    unmasked tokens of the global batch, not a mean of per-rank means)."""
    if cfg.train_dataset.type != "hf":
        return ids, ids
    from ..common.batch import model_args
    from ..data.handlers import parse_handlers
    from ..data.hf_dataset import feed_keys
    packed = parse_handlers(cfg.train_dataset.handler).pack_strategy is not None
    full = {"input_ids": ids, "labels": ids, "loss_mask": np.ones(ids.shape, np.float32),
            "position_ids": np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1)),
            "segment_ids": np.zeros(ids.shape, np.int32)}
    return model_args({k: full[k] for k in feed_keys(cfg.train_dataset.input_columns, packed)})


def model_config_for(spec, cfg: Config, shape: JobShape):
    """The model config of this job, built once: the family's ``from_model_config`` with the job's
    parallel sizes (dp, tp, pp, vpp, sequence parallel, ep), then a validated copy with the context
    parallel settings (``dataclasses.replace`` runs the config's checks again). Never edited after."""
    pc = cfg.parallel_config
    model_config = {k: v for k, v in dict(cfg.model.model_config).items() if k != "pet_config"}   # LoRA: below
    sizes = dict(pc, data_parallel=shape.dp, model_parallel=shape.tp, pipeline_stage=shape.pp, context_parallel=1,
                 use_seq_parallel=bool(pc.use_seq_parallel) and shape.tp > 1,
                 expert_parallel=int(pc.get("expert_parallel", 1) or 1))
    mcfg = spec.config_class.from_model_config(model_config, sizes, shape.vpp)
    return with_context_parallel(mcfg, pc, shape.cp)


def with_context_parallel(mcfg, parallel_config, cp: int):
    """A copy of the model config with the context-parallel size and method of ``parallel_config``
    (the model builds its rotary tables and causal mask in the sequence's storage order from them)."""
    return replace(mcfg, context_parallel_size=cp,
                   context_parallel_algo=normalize_algorithm(context_parallel_algorithm(dict(parallel_config))),
                   ulysses_degree_in_cp=parallel_config.get("ulysses_degree_in_cp"),
                   context_parallel_load_balance=bool(parallel_config.get("context_parallel_load_balance", True)))


def lora_settings(cfg: Config, shape: JobShape):
    """The run's LoRA settings (``model.model_config.pet_config``; the PyNative ``lora_config`` maps there), or
    None. Bad values and unsupported combinations are a ConfigError naming the key."""
    raw = dict(cfg.model.model_config).get("pet_config")
    if raw is None:
        return None
    from ..peft import LoraConfigError, parse_lora
    source = cfg.report.origin.get("model.model_config.pet_config", "model.model_config.pet_config") \
        if hasattr(cfg, "report") else "model.model_config.pet_config"
    try:
        settings = parse_lora(dict(raw), source)
    except LoraConfigError as e:
        raise ConfigError([str(e)]) from None
    if settings.dropout > 0 and shape.tp > 1:
        raise ConfigError([f"{source}.lora_dropout = {settings.dropout} with parallel_config.model_parallel = "
                           f"{shape.tp}: each tensor-parallel rank would draw its own dropout mask for the same "
                           "replicated input of a column-parallel linear (its output columns then see different "
                           "masks, unlike one process); set lora_dropout: 0 under tensor parallelism"])
    return settings


def lora_stage_problems(cfg: Config, shape: JobShape, measured: Optional[List[int]] = None) -> List[str]:
    """Under a pipeline (the preflight, before any process group): each pipeline rank must hold an adapted
    layer. LoRA trains the adapters only, so a rank whose stages adapt nothing (no decoder layer there, or none
    that ``target_modules`` names) would have no parameter to update. The stages are built as zeros (no draws)
    and only looked at. ``layers_per_stage: auto`` is measured after start-up: the preflight skips it and
    ``build_model`` checks the ``measured`` split (on every rank alike)."""
    settings = lora_settings(cfg, shape)
    split = cfg.parallel.pipeline_config.layers_per_stage
    if settings is None or shape.pp == 1 or (split == "auto" and measured is None):
        return []
    from ..peft.lora import matched_names
    spec = get_model_spec(cfg.model.arch.type)
    topo = Topology(0, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler, cp=shape.cp)
    counts = measured if split == "auto" else None if split is None else \
        [len(r) for r in topo.layer_ranges(int(cfg.model.model_config.num_layers), split)]
    adapted, layers = [], []
    try:
        mcfg = model_config_for(spec, cfg, shape)
        for k in range(topo.model_stage_num):
            with deferred_init():
                chunk = spec.model_class(mcfg, pp_rank=k % shape.pp, layers_per_stage=counts,
                                         vp_stage=k // shape.pp if shape.vpp > 1 else None)
            adapted.append(matched_names(chunk, settings))
            layers.append([n - 1 for n in chunk.decoder.layer_numbers])
    except (ValueError, TypeError, KeyError):     # a model that cannot be built: the build names it
        return []
    if not any(adapted):
        from ..peft.lora import no_match_error
        return [str(no_match_error(settings, chunk))]
    problems = []
    for r in range(shape.pp):
        held = sorted({topo.model_stage(s) for s, q in enumerate(topo.placement) if q == r})
        if not any(adapted[k] for k in held):
            where = ", ".join(f"{k} (layers {layers[k] or 'none'})" for k in held)
            problems.append(f"{settings.source}.target_modules = {list(settings.target_modules)!r} with "
                            f"parallel_config.pipeline_stage = {shape.pp}"
                            + (f" and parallel.pipeline_config.layers_per_stage = {split}" if split is not None else "")
                            + f": pipeline rank {r} runs model stage(s) {where}, where LoRA adapts no layer, so "
                            "that rank would have nothing to train (LoRA updates the adapters only); give every "
                            "pipeline rank's stages a decoder layer that target_modules names (another "
                            "layers_per_stage), widen target_modules, or use fewer pipeline stages")
    return problems


def lora_base_problems(cfg: Config, shape: JobShape, folder: str) -> List[str]:
    """LoRA and a Hugging Face folder (the preflight, before any process group): LoRA freezes the base, so every
    base weight must come from the folder (full fine-tuning draws what a folder lacks, e.g. DeepSeek-V3's MTP
    layers, and trains it; a random frozen weight would never be trained). The model is built as zeros (no
    draws), per model stage under a pipeline, and its trainable parameters' global names are looked up."""
    settings = lora_settings(cfg, shape)
    spec = get_model_spec(cfg.model.arch.type)
    held = hf_held(spec, folder) if settings is not None else None
    if held is None:
        return []
    from ..models.hf.loader import folder_holds
    adapter, tensors = held
    topo = Topology(0, shape.pp, shape.dp, shape.tp, shape.vpp, shape.scheduler, cp=shape.cp)
    split = cfg.parallel.pipeline_config.layers_per_stage
    missing = {}
    try:
        mcfg = model_config_for(spec, cfg, shape)
        for k in range(topo.model_stage_num if shape.pp > 1 else 1):
            if shape.pp > 1 and split == "auto":
                return []                      # (measured after start-up: the folder load names what is missing)
            counts = None if shape.pp == 1 or split is None else \
                [len(r) for r in topo.layer_ranges(int(cfg.model.model_config.num_layers), split)]
            with deferred_init():
                chunk = spec.model_class(mcfg) if shape.pp == 1 else spec.model_class(
                    mcfg, pp_rank=k % shape.pp, layers_per_stage=counts,
                    vp_stage=k // shape.pp if shape.vpp > 1 else None)
            numbers = chunk.decoder.layer_numbers if shape.pp > 1 else None
            for p in chunk.trainable_params():
                name = global_param_name(p.name, numbers)
                if not folder_holds(adapter, name, p.shape, tensors):
                    missing[name] = True
    except (ValueError, TypeError, KeyError):     # a model that cannot be built: the build names it
        return []
    if not missing:
        return []
    names = sorted(missing)
    hint = " (the multi-token prediction layers: set model.model_config.mtp_depth to 0, or use a folder that " \
           "holds them)" if all(n.startswith("mtp.") for n in names) else ""
    return [f"{settings.source} with load_checkpoint = {folder!r}: LoRA freezes the base model, so every base "
            f"weight must come from the folder, but {len(names)} parameter(s) have no tensor there: "
            f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}{hint}; a frozen random weight would never "
            "be trained (full fine-tuning draws and trains them)"]


def _apply_lora(settings, chunk, mcfg, rank: int, log=print, require_match: bool = True) -> list:
    """LoRA on ``chunk`` (nothing without settings); the adapted names. ``require_match=False``: a pipeline
    stage that holds none of the targets is not an error here (``lora_stage_problems`` checks every rank)."""
    if settings is None:
        return []
    from ..peft import LoraConfigError, apply_lora
    try:
        wrapped = apply_lora(chunk, settings, mcfg, require_match=require_match)
    except LoraConfigError as e:
        raise ConfigError([str(e)]) from None
    if rank == 0 and wrapped:
        trainable = sum(int(p.size) for p in chunk.trainable_params())
        total = sum(int(p.size) for p in chunk.get_parameters())
        log(f"LoRA r={settings.rank} alpha={settings.alpha:g} on {len(wrapped)} linears ({wrapped[0]}, ...): "
            f"{trainable} trainable of {total} parameters ({100 * trainable / max(total, 1):.2f}%)")
    return wrapped


def layer_counts(cfg: Config, topo: Topology, output_dir: str, log=print) -> Optional[List[int]]:
    """Layers per stage in model order: explicit ``layers_per_stage``, measured (``auto``), or
    None (MindFormers' ``offset``, or uniform)."""
    explicit = cfg.parallel.pipeline_config.layers_per_stage
    if explicit is None:
        return None
    if explicit == "auto":
        from .stage_planning import auto_stage_plan
        plan = auto_stage_plan(cfg.to_dict(), rank=topo.rank, output_dir=output_dir)
        if topo.rank == 0:
            log(f"layers_per_stage: auto -> {plan.counts} (stage_plan.json in {output_dir})")
        return plan.counts
    return [len(r) for r in topo.layer_ranges(int(cfg.model.model_config.num_layers), explicit)]


def _parallelize_stage(chunk, mcfg, s: int, topo: Topology, mesh, ids: np.ndarray, side: bool = False) -> None:
    """Model stage ``s`` takes ids (first stage) or hidden states, and labels on the last stage;
    hidden states arrive split over dp, their sequence over cp (context parallel) and tp (SP), as
    the previous stage's layers leave them; labels are split over dp and cp like the ids. ``side``
    (fine-tuning data): every stage also takes position_ids and segment_ids, the last the loss_mask, in
    the model's argument order (training/steps.py ``_SideInputStage``). A last stage with multi-token
    prediction (``takes_token_ids``) also takes the microbatch's ids (``token_ids``), split like the labels."""
    mtp_ids = [ids] if s == topo.model_stage_num - 1 and getattr(chunk, "takes_token_ids", False) else []
    if side:
        dpx = "dp" if topo.dp > 1 else "None"
        seq_axes = tuple(a for a, on in (("cp", topo.cp > 1), ("tp", mcfg.sequence_parallel)) if on)
        seq = seq_axes if len(seq_axes) > 1 else (seq_axes[0] if seq_axes else "None")
        tokens = mesh(dpx, "cp" if topo.cp > 1 else "None")
        pos = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
        seg = np.zeros(ids.shape, np.int32)
        last = s == topo.model_stage_num - 1
        x = ids if s == 0 else np.zeros(ids.shape + (mcfg.hidden_size,), np.float32)
        labels, mask = (ids, np.ones(ids.shape, np.float32)) if last else (None, None)
        samples = (x, labels, mask, pos, seg, *mtp_ids)
        layouts = [tokens if s == 0 else mesh(dpx, seq, "None")] + [tokens] * ((4 if last else 2) + len(mtp_ids))
        parallelize(chunk, mcfg, *samples, mesh=mesh, rank=topo.rank, input_layouts=layouts)
        return
    if s == 0:
        parallelize(chunk, mcfg, ids, mesh=mesh, rank=topo.rank)
        return
    dpx = "dp" if topo.dp > 1 else "None"
    seq_axes = tuple(a for a, on in (("cp", topo.cp > 1), ("tp", mcfg.sequence_parallel)) if on)
    seq = seq_axes if len(seq_axes) > 1 else (seq_axes[0] if seq_axes else "None")
    hidden = np.zeros(ids.shape + (mcfg.hidden_size,), np.float32)
    samples = [hidden, ids]
    layouts = [mesh(dpx, seq, "None"), mesh(dpx, "cp" if topo.cp > 1 else "None")]
    if s != topo.model_stage_num - 1:
        samples, layouts = samples[:1], layouts[:1]
    elif mtp_ids:        # (hidden, labels, loss_mask, position_ids, segment_ids, token_ids)
        samples, layouts = samples + [None, None, None, ids], layouts + layouts[1:]
    parallelize(chunk, mcfg, *samples, mesh=mesh, rank=topo.rank, input_layouts=layouts)


def _apply_recompute(cfg: Config, chunk, rank: int, log=print) -> None:
    """recompute_config / swap_config as MindFormers writes them (see docs/recompute.md)."""
    rc, sc = dict(cfg.recompute_config), dict(cfg.swap_config)
    if not any(rc.get(k) for k in ("recompute", "select_recompute", "select_comm_recompute")) and not sc.get("swap"):
        return
    from ..recompute import apply_mindformers
    try:
        rec, swp = apply_mindformers(chunk, rc, sc if sc.get("swap") else None)
    except ValueError as e:
        raise ConfigError([f"recompute_config / swap_config: {e}"]) from None
    if rank == 0:
        names = ", ".join(rec.names[:3]) + (", ..." if len(rec) > 3 else "")
        log(f"recompute: {len(rec)} Cells ({names})" + (f"; swap: {len(swp)} Cells" if swp is not None and len(swp)
                                                         else ""))
