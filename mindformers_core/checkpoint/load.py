"""Loading a distributed checkpoint into any layout, world size or a single process.

The targets say what the loading job needs (global shape and layout per parameter); the files
say what was saved. Nothing is returned unless every requested tensor validates: names (with
closest-name hints), global shapes, dtypes, shard coverage, file headers and the SHA-256 of every
file read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import format as fmt
from .errors import CheckpointError, Problem, raise_if
from .index import TensorIndex, check_complete, check_headers, index_rank_files
from .reshard import TensorSpec, execute, normalize_targets, plan_load

Step = Union[int, str]


def open_checkpoint(directory: str, step: Step = "latest") -> TensorIndex:
    """Index a published step (``"latest"`` by default) from its metadata only."""
    step = fmt.resolve_step(directory, step)
    sdir = fmt.step_dir(directory, step)
    where = f"checkpoint {sdir}"
    meta, problem = fmt.read_json(os.path.join(sdir, fmt.METADATA))
    if problem:
        raise CheckpointError(where, [problem])
    world = meta.get("world_size")
    if meta.get("format") != fmt.FORMAT or not isinstance(world, int) or world < 1 or meta.get("step") != step:
        raise CheckpointError(where, [Problem(
            "not a checkpoint of this format", file=fmt.METADATA,
            expected=f"format={fmt.FORMAT!r}, step={step}, world_size >= 1",
            found=f"format={meta.get('format')!r}, step={meta.get('step')!r}, world_size={world!r}")])
    if meta.get("version", 0) > fmt.VERSION:
        raise CheckpointError(where, [Problem("written by a newer format version", file=fmt.METADATA,
                                              expected=f"version <= {fmt.VERSION}", found=str(meta.get("version")))])
    index = index_rank_files(sdir, world, where)
    index.meta = meta
    return index


_VERIFIED: Dict[Tuple[str, int, int], str] = {}    # (path, size, mtime_ns) -> sha256 already computed


def checksum_problems(index: TensorIndex, paths) -> List[Problem]:
    """A problem for each file among ``paths`` whose bytes do not match the SHA-256 its rank
    recorded at save (flipped bits, truncation, a file from another save)."""
    problems = []
    for path in sorted(set(paths)):
        expected = index.checksums.get(path)
        if expected is None:
            continue
        try:
            st = os.stat(path)
        except OSError as e:
            problems.append(Problem("shard file is unreadable", file=os.path.basename(path), found=str(e)))
            continue
        key = (path, st.st_size, st.st_mtime_ns)
        found = _VERIFIED.get(key) or fmt.file_sha256(path)
        if found != expected:
            problems.append(Problem("shard file is corrupt (its SHA-256 differs from the one recorded at save)",
                                    file=os.path.basename(path), expected=expected[:16] + "...",
                                    found=found[:16] + "..."))
        else:
            _VERIFIED[key] = found
    return problems


def _execute_verified(index: TensorIndex, plan) -> Dict[str, np.ndarray]:
    raise_if(plan.where, checksum_problems(index, (r.shard.path for reads in plan.reads.values() for r in reads)))
    return execute(plan)


def verify_step(directory: str, step: Step = "latest") -> List[Problem]:
    """Every problem of a published step: metadata, rank files, tiling of every tensor, headers
    and checksums of all its files (reads every byte once). Empty = intact."""
    try:
        index = open_checkpoint(directory, step)
    except CheckpointError as e:
        return list(e.problems)
    problems = list(index.problems)
    if not problems:
        problems += check_complete(index)
        shards = [s for e in index.entries.values() for s in e.shards]
        problems += check_headers(index, shards)
        problems += checksum_problems(index, index.checksums)
    return problems


def newest_intact_step(directory: str, below: Optional[int] = None) -> Optional[int]:
    """The newest published step (older than ``below`` if given) that :func:`verify_step` passes."""
    for step in reversed(fmt.list_steps(directory)):
        if (below is None or step < below) and not verify_step(directory, step):
            return step
    return None


def load_checkpoint(directory: str, targets: Mapping[str, object], rank: int = 0, *,
                    step: Step = "latest", strict: bool = True) -> Dict[str, np.ndarray]:
    """This rank's local slice of every parameter in ``targets``.

    ``targets``: name -> (global shape, Layout or None[, dtype]) for the whole model, as the
    loading job shards it; names whose layout's rank_list excludes ``rank`` are validated but not
    returned (pipeline stages). With ``strict`` a saved parameter absent from ``targets`` is an
    error. Raises CheckpointError listing every problem before reading any tensor data.
    """
    specs = normalize_targets(targets)
    index = open_checkpoint(directory, step)
    return _execute_verified(index, plan_load(index, specs, rank, pool=index.names("param"), strict=strict))


def load_optimizer_state(directory: str, targets: Mapping[str, object], rank: int = 0, *,
                         step: Step = "latest", strict: bool = True) -> Dict[str, Dict[str, np.ndarray]]:
    """``{state name: {param name: local moment}}``; each moment is resharded like its parameter
    in ``targets``. With ``strict`` a saved moment of a parameter absent from ``targets`` is an
    error; parameters without moments (frozen) are simply absent."""
    specs = normalize_targets(targets)
    index = open_checkpoint(directory, step)
    pool = index.names("optimizer")
    wanted = {k: specs[index.entries[k].param] for k in pool if index.entries[k].param in specs}
    flat = _execute_verified(index, plan_load(index, wanted, rank, pool=pool, strict=strict))
    out: Dict[str, Dict[str, np.ndarray]] = {}
    for key, arr in flat.items():
        e = index.entries[key]
        out.setdefault(e.state, {})[e.param] = arr
    return out


@dataclass(frozen=True)
class TrainingState:
    """The non-tensor state of a step: what the trainer and each rank's data iterator saved."""
    step: int
    world_size: int
    trainer_state: Optional[dict]          # rank 0's
    data_states: Dict[int, Optional[dict]]  # per saving rank


def load_training_state(directory: str, step: Step = "latest") -> TrainingState:
    index = open_checkpoint(directory, step)
    if index.problems:
        raise CheckpointError(index.where, index.problems)
    ranks = index.rank_meta
    return TrainingState(index.meta["step"], index.meta["world_size"], ranks[0].get("trainer_state"),
                         {r: m.get("data_state") for r, m in sorted(ranks.items())})


def checkpoint_specs(directory: str, step: Step = "latest", kind: str = "param") -> Dict[str, TensorSpec]:
    """Saved tensors as targets for the full tensor (layout None): ``load_checkpoint(d,
    checkpoint_specs(d))`` loads the whole model into one process."""
    index = open_checkpoint(directory, step)
    if index.problems:
        raise CheckpointError(index.where, index.problems)
    return {k: TensorSpec(e.global_shape, None, e.dtype) for k, e in index.entries.items() if e.kind == kind}
