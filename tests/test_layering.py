"""Import direction: a package of mindformers_core imports only itself and strictly lower layers.

Every ``.py`` under ``mindformers_core/`` is parsed (not imported); every ``import`` and ``from ...
import`` -- at module level or inside a function -- is resolved to the top-level package it reaches
under ``mindformers_core``, and an arrow that does not point strictly down the table below fails the
test, as does any import of ``research`` (user entry points sit above everything). The top level --
the package's ``__init__.py`` (the public API) and modules directly under ``mindformers_core/`` such
as ``run.py`` -- may import every layer, and no package may import it.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "mindformers_core"

# The layering, bottom to top: the one place it is written down.
LAYERS: Dict[str, int] = {
    "common": 0,                                     # pure neutral helpers: stage/layer placement, RNG snapshot
    "distributed": 1,
    "sharding": 2,
    "transformer": 3, "optim": 3, "data": 3, "checkpoint": 3,
    "models": 4, "pipeline": 4, "recompute": 4, "hsdp": 4, "generation": 4,   # training (5) runs predict on it
    "peft": 4,                                       # LoRA adapters over the parallel linears
    "training": 5,
    "testing": 6, "examples": 6,
}
TOP = "top level"                 # mindformers_core/__init__.py and mindformers_core/<module>.py
TOP_LEVEL = max(LAYERS.values()) + 1
FORBIDDEN_ROOTS = ("research",)   # nothing inside the package imports the user entry points


def module_name(path: Path, root: Path) -> str:
    """``<root>/mindformers_core/pipeline/stage.py`` -> ``mindformers_core.pipeline.stage``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[Tuple[int, str]]:
    """``(line, absolute dotted name)`` of everything ``tree`` imports, wherever the statement is."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == PACKAGE:   # ``from mindformers_core import hsdp``: the names are the packages
                for alias in node.names:
                    yield node.lineno, f"{target}.{alias.name}"
            else:
                yield node.lineno, target


def package_of(dotted: str, packages) -> Optional[str]:
    """The top package under mindformers_core (``mindformers_core.sharding.layout`` -> ``sharding``);
    ``TOP`` for the package itself, a name of its public API or a top-level module; None outside."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in packages else TOP


def violations(root: Path, layers: Dict[str, int] = LAYERS) -> List[str]:
    """One line ``module:line -> imported (package level a -> package level b)`` per wrong arrow."""
    packages = set(layers) | {p.name for p in (root / PACKAGE).iterdir() if (p / "__init__.py").exists()}
    level = dict(layers, **{TOP: TOP_LEVEL})
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        module = module_name(path, root)
        source = package_of(module, packages)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, target in sorted(set(imported_modules(tree, module, path.name == "__init__.py"))):
            if target.split(".")[0] in FORBIDDEN_ROOTS:
                found.append(f"{module}:{line} -> {target} (imports the user entry points `research`)")
                continue
            dest = package_of(target, packages)
            if dest is None or dest == source or source == TOP:   # the top level imports every layer
                continue
            if source not in level or dest not in level:
                unknown = source if source not in level else dest
                found.append(f"{module}:{line} -> {target} (package {unknown!r} is not in the layer table)")
            elif level[dest] >= level[source]:
                found.append(f"{module}:{line} -> {target} ({source} level {level[source]} -> "
                             f"{dest} level {level[dest]})")
    return sorted(set(found))


def test_every_import_points_down_the_layering():
    bad = violations(ROOT)
    assert not bad, ("imports against the layering (a package may import itself and strictly lower "
                     "levels; see LAYERS in tests/test_layering.py):\n  " + "\n  ".join(bad))


def test_every_package_is_in_the_layer_table():
    packages = {p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"packages missing from LAYERS: {sorted(packages - set(LAYERS))}"


@pytest.mark.parametrize("where, source, expected", [
    ("sharding/bad.py", "from ..pipeline.stage import StageInfo\n", "sharding level 2 -> pipeline level 4"),
    ("transformer/bad.py", "def f():\n    import mindformers_core.hsdp.api\n", "transformer level 3 -> hsdp level 4"),
    ("pipeline/bad.py", "from ..recompute import units\n", "pipeline level 4 -> recompute level 4"),
    ("common/bad.py", "from .. import distributed\n", "common level 0 -> distributed level 1"),
    ("data/bad.py", "from research.llama import model\n", "imports the user entry points `research`"),
    ("data/bad.py", "import mindformers_core\n", f"data level 3 -> {TOP} level {TOP_LEVEL}"),
    ("pipeline/bad.py", "from .. import Trainer\n", f"pipeline level 4 -> {TOP} level {TOP_LEVEL}"),
    ("sharding/bad.py", "from mindformers_core.run import main\n", f"sharding level 2 -> {TOP} level {TOP_LEVEL}"),
    ("run.py", "from .pipeline import x\nimport research.llama\n", "imports the user entry points `research`"),
])
def test_a_wrong_arrow_is_reported(tmp_path, where, source, expected):
    for package in ("sharding", "transformer", "pipeline", "common", "data"):
        (tmp_path / PACKAGE / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / package / "__init__.py").write_text("")
    (tmp_path / PACKAGE / "__init__.py").write_text("from .pipeline import x\n")   # exempt
    (tmp_path / PACKAGE / "run.py").write_text("from .pipeline import x\n")   # exempt
    (tmp_path / PACKAGE / "pipeline" / "ok.py").write_text("from ..common.placement import stage_placement\n"
                                                            "from .stage import StageInfo\n")
    (tmp_path / PACKAGE / where).write_text(source)
    bad = violations(tmp_path)
    assert len(bad) == 1 and bad[0].startswith(f"{PACKAGE}.{where[:-3].replace('/', '.')}:") \
        and expected in bad[0], bad
