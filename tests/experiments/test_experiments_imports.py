"""experiments/ has no import circle, and its modules stay small.

An edge ``a -> b`` is an ``import`` of ``experiments.b`` (or ``from
experiments.b import ...``, or ``from experiments import b``) anywhere in
``a`` except inside a function body: module level, class bodies, ``try``
blocks and ``if TYPE_CHECKING:`` blocks all count (a type checker follows the
last, and a circle there is a circle in the design). Imports inside functions
do not count: they run when the function does, and are how the runner keeps
TensorFlow out of its main process and how registries name the code they run
(``"module:function"``). The module graph of those edges must have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import _cycles as cycles  # one cycle finder (Tarjan) for prune/ and experiments/

PACKAGE = Path(__file__).resolve().parents[2] / "experiments"
LIMIT = 700  # lines; "about 600", the largest schema module (config.py) included


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import outside function bodies."""
    out: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, []) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.module, [a.name for a in child.names]))
            visit(child)

    visit(tree)
    return out


def module_graph() -> dict[str, set[str]]:
    """Module-level import edges between the modules of ``experiments``."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target, names in _imports(ast.parse(path.read_text(), str(path))):
            candidates = [target, *(f"{target}.{n}" for n in names)]
            edges |= {c for c in candidates if c in modules and c != name and c != "experiments"}
        graph[name] = edges
    return graph


def test_the_checker_finds_a_circle_and_accepts_a_tree():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    tree = ast.parse(
        "import experiments.x\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from experiments.y import Y\n"
        "def f():\n    from experiments.z import Z\nclass C:\n    from experiments import w\n"
    )
    assert [m for m, _ in _imports(tree)] == ["experiments.x", "typing", "experiments.y", "experiments"]


def test_experiments_has_no_import_circle():
    graph = module_graph()
    assert "experiments.axes" in graph and "experiments.config" in graph["experiments.grid"]
    assert cycles(graph) == []


def test_no_experiments_module_is_over_the_size_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
