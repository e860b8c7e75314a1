"""No import circles between the modules of one package of mindformers_core.

Every ``.py`` is parsed (not imported); each ``import`` / ``from ... import`` -- at module level or
inside a function -- is an arrow to the module it names (``from .comm import functional``: to
``comm.functional``; ``from .rules import infer``: to the package ``rules``). Arrows between two
packages are the layering's business (tests/test_layering.py); here the arrows inside one top-level
package must not close a circle. Importing a module also runs its parent packages' ``__init__``,
which is no circle: those arrows are not drawn.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

from tests.test_layering import PACKAGE, ROOT, module_name


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """``module -> modules it imports`` inside the same top-level package of ``mindformers_core``."""
    files = {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    graph: Dict[str, Set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in imported(tree, module, path.name == "__init__.py", files):
            if target != module and _top(module) is not None and _top(target) == _top(module):
                graph[module].add(target)
    return graph


def imported(tree: ast.AST, module: str, is_package: bool, files) -> Iterator[str]:
    """The modules of ``files`` that ``tree`` imports: ``from X import name`` is ``X.name`` when that
    is a module, else ``X``; a name outside ``files`` counts as its longest prefix in them."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join((here[:len(here) - (node.level - 1)] if node.level else [])
                            + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            while parts and ".".join(parts) not in files:
                parts.pop()
            if parts:
                yield ".".join(parts)


def _top(module: str) -> Optional[str]:
    """The top-level package of a module inside one (``mindformers_core.sharding.rules.loss`` -> sharding)."""
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 2 else None


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_inside_a_package():
    found = cycles(import_graph(ROOT))
    assert not found, ("import circles (move the shared piece to a module both can import, below them):\n  "
                       + "\n  ".join(" <-> ".join(c) for c in found))


@pytest.mark.parametrize("files, expected", [
    ({"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"}, [["a", "b"]]),
    ({"a.py": "from .b import y\n", "b.py": "from .c import z\n", "c.py": "import mindformers_core.p.a\n"},
     [["a", "b", "c"]]),
    ({"a.py": "from . import b\n", "b.py": "from .. import q\n"}, []),      # other package: the layering's
    ({"a.py": "from .sub import thing\n", "sub/__init__.py": "", "sub/thing.py": "from .. import a\n"},
     [["a", "sub.thing"]]),
    ({"__init__.py": "from .a import f\n", "a.py": "from .b import g\n", "b.py": ""}, []),   # parents: no arrow
])
def test_a_circle_is_found(tmp_path, files, expected):
    (tmp_path / PACKAGE / "p").mkdir(parents=True)
    (tmp_path / PACKAGE / "q").mkdir(parents=True)
    for d in ("", "p", "q"):
        (tmp_path / PACKAGE / d / "__init__.py").touch()
    for name, text in files.items():
        path = tmp_path / PACKAGE / "p" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = cycles(import_graph(tmp_path))
    assert found == [[f"{PACKAGE}.p.{m}" for m in c] for c in expected]
