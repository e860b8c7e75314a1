"""What a checkpoint holds, read from metadata only: per tensor its global shape, dtype, layout
and the saved shards (file, key, global slice).

Building the index reads the small per-rank JSON files (or one safetensors header), never tensor
data, and records every inconsistency as a :class:`Problem`. Loading, merging and publishing a
save all start from this index, so they validate the same way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from safetensors import safe_open

from . import format as fmt
from .errors import Problem

Region = Tuple[Tuple[int, int], ...]


@dataclass(frozen=True)
class ShardRef:
    """One saved piece of a tensor: ``key`` in safetensors file ``path`` is ``region`` of it."""
    path: str
    key: str
    region: Region

    @property
    def file(self) -> str:
        return os.path.basename(self.path)


@dataclass
class Entry:
    """A tensor of the checkpoint (a parameter, or an optimizer moment of one)."""
    key: str
    kind: str                       # "param" or "optimizer"
    param: str
    state: Optional[str]
    global_shape: Tuple[int, ...]
    dtype: str
    layout: Optional[dict]
    source: str                     # file where it was first described (for messages)
    shards: List[ShardRef] = field(default_factory=list)
    holders: List[Tuple[int, Region, int]] = field(default_factory=list)   # (rank, region, writer)


@dataclass
class TensorIndex:
    where: str
    entries: Dict[str, Entry] = field(default_factory=dict)
    problems: List[Problem] = field(default_factory=list)
    rank_meta: Dict[int, dict] = field(default_factory=dict)     # rank -> its JSON (states included)
    checksums: Dict[str, str] = field(default_factory=dict)      # safetensors path -> recorded sha256
    meta: dict = field(default_factory=dict)                     # the step's metadata.json

    def names(self, kind: str) -> List[str]:
        return [k for k, e in self.entries.items() if e.kind == kind]


def volume(region: Iterable[Tuple[int, int]]) -> int:
    n = 1
    for a, b in region:
        n *= max(0, b - a)
    return n


def intersect(a: Region, b: Region) -> Optional[Region]:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) or not out else None


# ---- distributed checkpoints ------------------------------------------------------------------
def _parse_record(key: str, rec, file: str) -> Tuple[Optional[dict], Optional[Problem]]:
    """Schema check of one tensor record of a rank JSON."""
    def bad(why):
        return None, Problem(f"corrupt tensor record ({why})", file=file, tensor=key,
                             expected="global_shape, dtype, slice, kind, written, writer", found=repr(rec)[:200])
    if not isinstance(rec, dict):
        return bad("not an object")
    shape = rec.get("global_shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        return bad("global_shape")
    region = rec.get("slice")
    if (not isinstance(region, list) or len(region) != len(shape)
            or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p)
                       and 0 <= p[0] <= p[1] <= s for p, s in zip(region, shape))):
        return bad("slice")
    if not isinstance(rec.get("dtype"), str) or rec.get("kind") not in ("param", "optimizer"):
        return bad("dtype/kind")
    if not isinstance(rec.get("written"), bool) or not isinstance(rec.get("writer"), int):
        return bad("written/writer")
    if not isinstance(rec.get("param"), str):
        return bad("param")
    return rec, None


def index_rank_files(directory: str, world_size: int, where: str) -> TensorIndex:
    """Index ``rank_<r>.json`` for r < world_size in ``directory`` (a step or staging dir)."""
    index = TensorIndex(where)
    for r in range(world_size):
        stem = fmt.rank_stem(r)
        json_name = stem + ".json"
        meta, problem = fmt.read_json(os.path.join(directory, json_name))
        if problem:
            index.problems.append(problem)
            continue
        if meta.get("rank") != r or meta.get("world_size") != world_size or not isinstance(meta.get("tensors"), dict):
            index.problems.append(Problem("rank file does not match its name or the checkpoint", file=json_name,
                                          expected=f"rank={r}, world_size={world_size}, a 'tensors' object",
                                          found=f"rank={meta.get('rank')!r}, world_size={meta.get('world_size')!r}"))
            continue
        index.rank_meta[r] = meta
        data_path = os.path.join(directory, stem + ".safetensors")
        if isinstance(meta.get("sha256"), str):      # (checkpoints written before checksums have none)
            index.checksums[data_path] = meta["sha256"]
        for key, raw in meta["tensors"].items():
            rec, problem = _parse_record(key, raw, json_name)
            if problem:
                index.problems.append(problem)
                continue
            shape = tuple(rec["global_shape"])
            region = tuple((a, b) for a, b in rec["slice"])
            entry = index.entries.get(key)
            if entry is None:
                entry = index.entries[key] = Entry(key, rec["kind"], rec["param"], rec.get("state"), shape,
                                                   rec["dtype"], rec.get("layout"), json_name)
            elif (entry.global_shape, entry.dtype, entry.kind) != (shape, rec["dtype"], rec["kind"]):
                index.problems.append(Problem(
                    "ranks disagree about this tensor", file=json_name, tensor=key,
                    expected=f"{entry.kind} {entry.dtype}{list(entry.global_shape)} as in {entry.source}",
                    found=f"{rec['kind']} {rec['dtype']}{list(shape)}"))
                continue
            elif entry.layout != rec.get("layout"):
                index.problems.append(Problem("ranks disagree about this tensor's layout", file=json_name,
                                              tensor=key, expected=f"{entry.layout} as in {entry.source}",
                                              found=str(rec.get("layout"))))
                continue
            entry.holders.append((r, region, rec["writer"]))
            if rec["written"] and all(s.region != region for s in entry.shards):
                entry.shards.append(ShardRef(data_path, key, region))
    return index


def check_complete(index: TensorIndex) -> List[Problem]:
    """Used before publishing a save: every holder's slice was written by its writer, and the
    written slices tile each tensor exactly."""
    problems = []
    for key, e in index.entries.items():
        written = {s.region: s for s in e.shards}
        for rank, region, writer in e.holders:
            if region not in written:
                problems.append(Problem(
                    f"rank {rank} holds slice {fmt.describe_region(region)} but its writer, rank {writer}, "
                    f"did not save it", file=f"{fmt.rank_stem(writer)}.safetensors", tensor=key,
                    expected=f"a shard {fmt.describe_region(region)} (layout {e.layout})",
                    found="nothing; a tensor held by only some ranks needs a Layout whose rank_list names "
                          "them (layout None means replicated on every rank, written by rank 0)"))
        problems += coverage_problems(e, tuple((0, s) for s in e.global_shape))
    return problems


def coverage_problems(e: Entry, target: Region, shards: Optional[List[ShardRef]] = None,
                      for_whom: str = "the full tensor") -> List[Problem]:
    """Problems if the saved shards overlapping ``target`` overlap each other or leave a gap."""
    shards = e.shards if shards is None else shards
    parts = [(s, r) for s in shards if (r := intersect(s.region, target)) is not None]
    for i, (a, ra) in enumerate(parts):
        for b, rb in parts[i + 1:]:
            if intersect(ra, rb) is not None and volume(ra) and volume(rb):
                return [Problem("saved shards overlap", file=f"{a.file}, {b.file}", tensor=e.key,
                                expected="disjoint slices",
                                found=f"{fmt.describe_region(a.region)} and {fmt.describe_region(b.region)}")]
    covered = sum(volume(r) for _, r in parts)
    need = volume(target)
    if covered >= need:
        return []
    gap = _first_gap(target, [r for _, r in parts])
    have = ", ".join(f"{s.file} {fmt.describe_region(s.region)}" for s in e.shards) or "none"
    return [Problem(f"saved shards do not cover the slice {fmt.describe_region(target)} needed by {for_whom} "
                    f"(missing shard or file)", file=e.source, tensor=e.key,
                    expected=f"global elements {fmt.describe_region(gap)} in some shard",
                    found=f"{covered} of {need} elements; shards: {have}")]


def _first_gap(target: Region, parts: List[Region]) -> Region:
    """Bounding box of the uncovered part of ``target`` (error path only)."""
    import numpy as np
    mask = np.zeros(fmt.shape_of(target), dtype=bool)
    for r in parts:
        mask[tuple(slice(a - t0, b - t0) for (a, b), (t0, _) in zip(r, target))] = True
    idx = np.argwhere(~mask)
    lo, hi = idx.min(axis=0), idx.max(axis=0) + 1
    return tuple((int(t0 + a), int(t0 + b)) for (t0, _), a, b in zip(target, lo, hi))


# ---- safetensors headers ----------------------------------------------------------------------
def read_header(path: str) -> Tuple[Optional[Dict[str, Tuple[Tuple[int, ...], str]]], Optional[Problem]]:
    """key -> (shape, numpy dtype name) of a safetensors file, or the problem opening it. Opening
    checks the header and that the file is as long as the header says (truncation)."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return None, Problem("file is missing", file=name, found=f"no file at {path}")
    try:
        with safe_open(path, framework="np") as f:
            out = {}
            for k in f.keys():
                sl = f.get_slice(k)
                code = sl.get_dtype()
                out[k] = (tuple(sl.get_shape()), fmt.SAFETENSORS_DTYPES.get(code, code))
            return out, None
    except Exception as e:  # safetensors raises its own SafetensorError / OSError
        return None, Problem("corrupt safetensors file", file=name, expected="a complete safetensors file",
                             found=f"{type(e).__name__}: {e}")


def check_headers(index: TensorIndex, shards: Iterable[ShardRef], exact_files: bool = False) -> List[Problem]:
    """Each shard's file exists and holds its key with the shard's shape and the tensor's dtype.
    With ``exact_files`` a file may not hold keys the metadata does not describe."""
    by_file: Dict[str, List[ShardRef]] = {}
    for s in shards:
        by_file.setdefault(s.path, []).append(s)
    problems = []
    for path, refs in sorted(by_file.items()):
        header, problem = read_header(path)
        if problem:
            problem = Problem(problem.what, file=problem.file, tensor=refs[0].key,
                              expected=f"{len(refs)} shard(s) of {sorted({r.key for r in refs})[:5]}",
                              found=problem.found)
            problems.append(problem)
            continue
        for s in refs:
            e = index.entries[s.key]
            want = (fmt.shape_of(s.region), e.dtype)
            got = header.get(s.key)
            if got != want:
                problems.append(Problem("shard in the file does not match the metadata", file=s.file, tensor=s.key,
                                        expected=f"{want[1]}{list(want[0])}",
                                        found="no such key" if got is None else f"{got[1]}{list(got[0])}"))
        if exact_files:
            extra: Set[str] = set(header) - {s.key for s in refs}
            if extra:
                problems.append(Problem("file holds tensors its JSON does not describe", file=os.path.basename(path),
                                        expected="only the described shards", found=sorted(extra)[:10]))
    return problems


# ---- single files -----------------------------------------------------------------------------
def index_single_file(path: str) -> TensorIndex:
    """A plain safetensors file of full tensors: one shard per tensor covering all of it."""
    index = TensorIndex(f"safetensors file {path}")
    header, problem = read_header(path)
    if problem:
        index.problems.append(problem)
        return index
    name = os.path.basename(path)
    for key, (shape, dtype) in header.items():
        if key.startswith(fmt.OPTIMIZER_PREFIX) and key.count("/") >= 2:
            _, state, param = key.split("/", 2)
            kind = "optimizer"
        else:
            kind, state, param = "param", None, key
        region = tuple((0, s) for s in shape)
        index.entries[key] = Entry(key, kind, param, state, shape, dtype, None, name,
                                   shards=[ShardRef(path, key, region)], holders=[(0, region, 0)])
    return index
