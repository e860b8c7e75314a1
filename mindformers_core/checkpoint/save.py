"""Saving: every rank writes its own shards, rank 0 checks the whole and publishes it atomically.

A slice held by several ranks (data-parallel replicas) is written once, by the lowest rank
holding it, so a checkpoint's size does not grow with the data-parallel degree. Three phases:

1. :func:`write_shards` (every rank): ``rank_<r>.safetensors`` + ``rank_<r>.json`` into
   ``step_<k>.tmp/``.
2. barrier
3. :func:`finalize_checkpoint` (rank 0): validate every rank's files (each slice written by its
   writer, shards tile every tensor, headers match), write ``metadata.json``, rename the
   directory to ``step_<k>``, then replace ``latest_checkpointed_iteration.txt``.

:func:`save_checkpoint` runs all three with a barrier; tests simulate N ranks in one process by
calling ``write_shards`` per rank and ``finalize_checkpoint`` once.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from ..sharding.layout import Layout, as_layout
from . import format as fmt
from .errors import CheckpointError, Problem, raise_if
from .index import check_complete, check_headers, index_rank_files, read_header

Array = Any   # np.ndarray, mindspore Tensor or Parameter


def _to_numpy(value: Array, what: str) -> np.ndarray:
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    if not isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        raise TypeError(f"{what}: expected a NumPy array or MindSpore Tensor/Parameter, got {type(value).__name__}")
    return np.asarray(value, order="C")   # (np.ascontiguousarray would turn a 0-d array into 1-d)


def _json_state(value: Optional[dict], what: str) -> Optional[dict]:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"save_checkpoint: {what} must be a JSON-serializable dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"save_checkpoint: {what} is not JSON-serializable: {e}") from None


def lowest_replica(layout: Layout, rank: int) -> int:
    """The lowest rank holding the same slice as ``rank``: same coordinates on the axes that
    split the tensor, any coordinates on the others (enumerates only the replicas)."""
    coord = layout.coordinate(rank)
    split = set(layout.sharded_axes())
    free = [(i, size) for i, (a, size) in enumerate(zip(layout.alias_name, layout.device_matrix)) if a not in split]
    best = rank
    for combo in itertools.product(*(range(size) for _, size in free)):
        c = [coord[a] for a in layout.alias_name]
        for (i, _), v in zip(free, combo):
            c[i] = v
        flat = 0
        for v, size in zip(c, layout.device_matrix):
            flat = flat * size + v
        best = min(best, layout.rank_list[flat])
    return best


def shard_record(name: str, local: np.ndarray, layout: Optional[Layout], rank: int) -> Tuple[dict, bool]:
    """Metadata of ``rank``'s shard ``local`` of tensor ``name`` and whether this rank writes it.

    The global shape is the local one times each dim's split; the writer of a slice is the lowest
    rank of the layout holding the same slice. ``layout=None`` means the full tensor replicated on
    every rank (written by rank 0).
    """
    if layout is None:
        shape = tuple(local.shape)
        region = [[0, s] for s in shape]
        writer = 0
    else:
        layout = as_layout(layout)
        if layout.dims is None:
            raise ValueError(f"save_checkpoint: layout of {name!r} has no tensor map; call it with one entry "
                             f"per tensor dim, e.g. layout('dp', 'None')")
        if layout.partial:
            raise ValueError(f"save_checkpoint: {name!r} has a partial layout {layout!r}; reduce it first "
                             f"(a checkpoint stores values, not pending sums)")
        if layout.ndim != local.ndim:
            raise ValueError(f"save_checkpoint: {name!r} has {local.ndim} dims (local shape {local.shape}) but "
                             f"its layout {layout.describe()} has {layout.ndim}")
        if rank not in layout.rank_list:
            raise ValueError(f"save_checkpoint: rank {rank} passed {name!r} but its layout's rank_list "
                             f"{layout.rank_list} does not include that rank")
        shape = tuple(n * layout.split_count(d) for d, n in enumerate(local.shape))
        mine = layout.local_slice(shape, rank)
        region = fmt.slice_to_json(mine)
        writer = lowest_replica(layout, rank)
    record = {"global_shape": list(shape), "dtype": local.dtype.name, "layout": fmt.layout_to_dict(layout),
              "slice": region, "writer": writer, "written": writer == rank}
    return record, writer == rank


def write_shards(directory: str, step: int, params: Mapping[str, Array],
                 layouts: Optional[Mapping[str, Optional[Layout]]] = None, *,
                 optimizer_state: Optional[Mapping[str, Mapping[str, Array]]] = None,
                 data_state: Optional[dict] = None, trainer_state: Optional[dict] = None,
                 rank: int = 0, world_size: int = 1, require_finite: bool = True) -> str:
    """Phase 1 of a save, on one rank: write this rank's files into the staging directory.

    ``params``: name -> this rank's local shard; ``layouts``: name -> Layout (None or absent =
    full tensor on every rank). ``optimizer_state``: state name -> {param name -> local moment},
    each stored with its parameter's layout. ``data_state`` (this rank's data iterator) and
    ``trainer_state`` (step, seed, lr step...) must be JSON-serializable. ``require_finite``: a
    floating-point tensor holding NaN or inf fails the save (nothing is published). The file's
    SHA-256 goes into the rank's JSON. Returns the staging dir.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"save_checkpoint: step={step!r} must be a non-negative int")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"save_checkpoint: rank={rank!r}, world_size={world_size!r}; need 0 <= rank < world_size")
    if not isinstance(params, Mapping):
        raise TypeError(f"save_checkpoint: params must be a dict name -> local array, got {type(params).__name__}")
    layouts = dict(layouts or {})
    unknown = sorted(set(layouts) - set(params))
    if unknown:
        raise ValueError(f"save_checkpoint: layouts given for {unknown}, which are not in params")
    tensors: Dict[str, dict] = {}
    data: Dict[str, np.ndarray] = {}
    local_shapes = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name or name.startswith(fmt.OPTIMIZER_PREFIX):
            raise ValueError(f"save_checkpoint: parameter name {name!r} must be a non-empty string not starting "
                             f"with {fmt.OPTIMIZER_PREFIX!r} (reserved for optimizer state)")
        arr = _to_numpy(value, f"save_checkpoint: params[{name!r}]")
        record, mine = shard_record(name, arr, layouts.get(name), rank)
        tensors[name] = {"kind": "param", "param": name, "state": None, **record}
        local_shapes[name] = arr.shape
        if mine:
            data[name] = arr
    for state, moments in (optimizer_state or {}).items():
        if not isinstance(state, str) or not state or "/" in state or not isinstance(moments, Mapping):
            raise ValueError(f"save_checkpoint: optimizer_state[{state!r}] must be a dict param name -> local "
                             f"array under a state name without '/'")
        for pname, value in moments.items():
            if pname not in params:
                raise ValueError(f"save_checkpoint: optimizer_state[{state!r}] has {pname!r}, which is not in "
                                 f"params (moments take their parameter's layout)")
            arr = _to_numpy(value, f"save_checkpoint: optimizer_state[{state!r}][{pname!r}]")
            if arr.shape != local_shapes[pname]:
                raise ValueError(f"save_checkpoint: optimizer_state[{state!r}][{pname!r}] has local shape "
                                 f"{arr.shape}, its parameter has {local_shapes[pname]}")
            key = fmt.optimizer_key(state, pname)
            record, mine = shard_record(key, arr, layouts.get(pname), rank)
            tensors[key] = {"kind": "optimizer", "param": pname, "state": state, **record}
            if mine:
                data[key] = arr
    if require_finite:
        bad = [k for k, arr in data.items() if arr.dtype.kind == "f" and not np.isfinite(arr).all()]
        if bad:
            raise ValueError(f"save_checkpoint: step {step} holds non-finite values (NaN/inf) in {len(bad)} "
                             f"tensor(s) on rank {rank}, e.g. {bad[:3]}; refusing to publish it (the previous "
                             f"checkpoint stays latest)")
    meta = {"format": fmt.FORMAT, "version": fmt.VERSION, "step": int(step), "rank": rank,
            "world_size": world_size, "tensors": tensors,
            "data_state": _json_state(data_state, "data_state"),
            "trainer_state": _json_state(trainer_state, "trainer_state")}

    stage = fmt.staging_dir(directory, int(step))
    os.makedirs(stage, exist_ok=True)
    stem = os.path.join(stage, fmt.rank_stem(rank))
    write_safetensors(stem + ".safetensors", data)
    meta["sha256"] = fmt.file_sha256(stem + ".safetensors")
    fmt.write_json_atomic(stem + ".json", meta)          # JSON after data: its presence means "done"
    if os.path.exists(stem + ".failed"):
        os.remove(stem + ".failed")
    return stage


def write_safetensors(path: str, data: Dict[str, np.ndarray]) -> None:
    """Through MindSpore's writer (format="safetensors"). It writes ``<stem>.tmp`` then renames,
    but deletes an existing target first; staging files are private, so that is fine here."""
    import mindspore as ms
    from mindspore import Tensor
    ms.save_checkpoint([{"name": k, "data": Tensor.from_numpy(v)} for k, v in data.items()], path,
                       format="safetensors")
    fmt.fsync_path(path)


def finalize_checkpoint(directory: str, step: int, world_size: int) -> str:
    """Phase 3 of a save, once (rank 0) after every rank's ``write_shards``: validate the staging
    directory as a whole, then publish it as ``step_<k>`` and point the tracker at it.

    Raises CheckpointError and publishes nothing if any rank's files are missing, failed,
    corrupt or inconsistent; the staging directory is left for inspection.
    """
    stage = fmt.staging_dir(directory, step)
    where = f"saving step {step} in {directory} (staging {os.path.basename(stage)})"
    if not os.path.isdir(stage):
        raise CheckpointError(where, [Problem("staging directory is missing", file=os.path.basename(stage),
                                              expected="files written by write_shards on every rank")])
    failed = []
    for r in range(world_size):
        marker = os.path.join(stage, fmt.rank_stem(r) + ".failed")
        if os.path.exists(marker):
            with open(marker, errors="replace") as f:
                failed.append(Problem("rank failed while writing", file=os.path.basename(marker), found=f.read()[:300]))
    index = index_rank_files(stage, world_size, where)
    problems = failed + index.problems
    for r, meta in index.rank_meta.items():
        if meta.get("step") != step:
            problems.append(Problem("rank file belongs to another step", file=f"{fmt.rank_stem(r)}.json",
                                    expected=str(step), found=str(meta.get("step"))))
    if not problems:
        problems += check_complete(index)
        writers = {s.path for e in index.entries.values() for s in e.shards}
        problems += check_headers(index, [s for e in index.entries.values() for s in e.shards], exact_files=True)
        for r in range(world_size):                      # ranks that wrote no shard: an empty, valid file
            path = os.path.join(stage, fmt.rank_stem(r) + ".safetensors")
            if path not in writers:
                header, problem = read_header(path)
                if problem or header:
                    problems.append(problem or Problem("file holds tensors its JSON does not describe",
                                                       file=os.path.basename(path), expected="no tensors",
                                                       found=sorted(header)[:10]))
    raise_if(where, problems)

    expected = {fmt.rank_stem(r) + ext for r in range(world_size) for ext in (".json", ".safetensors")}
    for name in os.listdir(stage):                       # leftovers of an earlier, larger attempt
        if name not in expected:
            os.remove(os.path.join(stage, name))
    fmt.write_json_atomic(os.path.join(stage, fmt.METADATA), {
        "format": fmt.FORMAT, "version": fmt.VERSION, "step": step, "world_size": world_size,
        "files": sorted(expected), "tensors": len(index.entries), "time": time.time()})
    fmt.fsync_path(stage)
    final = fmt.step_dir(directory, step)
    old = None
    if os.path.exists(final):                            # re-saving a step: move the old one aside
        old = f"{final}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(stage, final)
    fmt.fsync_path(directory)
    fmt.write_text_atomic(os.path.join(directory, fmt.TRACKER), f"{step}\n")
    if old:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_checkpoint(directory: str, step: int, params: Mapping[str, Array],
                    layouts: Optional[Mapping[str, Optional[Layout]]] = None, *,
                    optimizer_state: Optional[Mapping[str, Mapping[str, Array]]] = None,
                    data_state: Optional[dict] = None, trainer_state: Optional[dict] = None,
                    rank: Optional[int] = None, world_size: Optional[int] = None,
                    barrier: Optional[Callable[[], None]] = None) -> str:
    """Save one step on every rank (a collective call when ``world_size > 1``); returns
    ``<directory>/step_<step>``.

    ``rank``/``world_size`` default to ``mindformers_core.distributed``'s; ``barrier`` defaults
    to the world ``comm.barrier``. A rank that fails while writing leaves a marker and still
    joins the barriers, so the others do not hang and rank 0 publishes nothing; every rank then
    raises.
    """
    if rank is None or world_size is None:
        from ..distributed import get_env
        env = get_env()
        rank = env.rank if rank is None else rank
        world_size = env.world_size if world_size is None else world_size
    if barrier is None:
        if world_size > 1:
            from ..distributed.comm.functional import barrier as comm_barrier
            barrier = comm_barrier
        else:
            barrier = lambda: None  # noqa: E731
    error: Optional[BaseException] = None
    try:
        write_shards(directory, step, params, layouts, optimizer_state=optimizer_state, data_state=data_state,
                     trainer_state=trainer_state, rank=rank, world_size=world_size)
    except Exception as e:
        error = e
        try:
            stage = fmt.staging_dir(directory, int(step))
            os.makedirs(stage, exist_ok=True)
            with open(os.path.join(stage, fmt.rank_stem(rank) + ".failed"), "w") as f:
                f.write(f"{type(e).__name__}: {e}")
        except Exception:
            pass
    barrier()
    if rank == 0 and error is None:
        try:
            finalize_checkpoint(directory, int(step), world_size)
        except Exception as e:
            error = e
    barrier()
    if error is not None:
        raise error
    stage, final = fmt.staging_dir(directory, int(step)), fmt.step_dir(directory, int(step))
    if os.path.exists(stage) or not os.path.isdir(final):
        raise CheckpointError(f"saving step {step} in {directory}", [Problem(
            "rank 0 did not publish the checkpoint (see rank 0's error)", file=os.path.basename(stage),
            expected=f"{os.path.basename(final)}/ published")])
    return final
