"""The code base's shape: no import circle, imports one way (benchmarks -> experiments -> prune), private Keras
access in one module, a TensorFlow-free engine.

Static checks over the source (``ast``), so they hold for every module whether a test imports it or not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["prune", "experiments"]
LAYERS = ["prune", "experiments", "benchmarks"]
"""From the bottom: a module may import its own layer and those below it, never one above."""


def _modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str] | None, lazy: bool) -> set[str]:
    """Modules of ``known`` (every module if ``None``) that ``name`` imports: at import time (top-level statements),
    or anywhere (``lazy``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

    def visit(nodes: list[Any]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
            elif not lazy and isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif not lazy and isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])

    visit(list(ast.walk(tree)) if lazy else tree.body)
    return {m for m in found if (known is None or m in known) and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def _graph(lazy: bool, packages: list[str] = PACKAGES, root: Path = ROOT) -> dict[str, set[str]]:
    modules = {n: p for pkg in packages for n, p in _modules(pkg, root).items()}
    graph = {}
    for name, path in modules.items():
        deps = _imports(name, path, set(modules), lazy)
        # importing a submodule runs its parent packages first: a package and its modules are not a circle
        graph[name] = {d for d in deps if not name.startswith(d + ".") and d not in packages}
    return graph


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_even_through_lazy_imports(package):
    """No module needs, at import time or later in a function, a module that needs it back."""
    assert _cycles(_graph(lazy=False, packages=[package])) == []
    assert _cycles(_graph(lazy=True, packages=[package])) == []


def test_no_import_circle_across_the_packages():
    assert _cycles(_graph(lazy=True)) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_finds_a_circle_closed_by_a_lazy_import(tmp_path):
    """The shape of ``experiments``' old circle: config -> axes at import time, axes -> train in a function, train ->
    config at import time; only the lazy graph sees it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("from pkg import axes\n")
    (pkg / "axes.py").write_text("def check():\n    from pkg.train import steps\n")
    (pkg / "train.py").write_text("from pkg.config import RunConfig\n")
    assert _cycles(_graph(lazy=False, packages=["pkg"], root=tmp_path)) == []
    assert _cycles(_graph(lazy=True, packages=["pkg"], root=tmp_path)) == [["pkg.axes", "pkg.config", "pkg.train"]]


def _upward_imports(layers: list[str] = LAYERS, root: Path = ROOT) -> list[str]:
    rank = {layer: i for i, layer in enumerate(layers)}
    out = []
    for layer in layers:
        for name, path in _modules(layer, root).items():
            for dep in sorted(_imports(name, path, None, lazy=True)):
                if rank.get(dep.split(".")[0], -1) > rank[layer]:
                    out.append(f"{path.relative_to(root)} imports {dep}")
    return out


def test_imports_run_one_way_benchmarks_experiments_prune():
    """``prune`` imports neither ``experiments`` nor ``benchmarks``, ``experiments`` does not import ``benchmarks``,
    not even inside a function."""
    assert _upward_imports() == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    for layer, code in [("low", "def f():\n    import high.b\n"), ("high", "import low\n")]:
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "__init__.py").write_text("")
        (tmp_path / layer / ("a.py" if layer == "low" else "b.py")).write_text(code)
    assert _upward_imports(["low", "high"], tmp_path) == ["low/a.py imports high.b"]


def test_no_module_name_is_in_both_packages():
    """``prune.training.imp`` and ``experiments.imp`` were two modules a reader had to tell apart: each module's own name
    (its last part, in any folder) belongs to one package."""
    names = {pkg: {n.rsplit(".", 1)[-1] for n in _modules(pkg) if "." in n} - {"__main__"} for pkg in PACKAGES}
    assert names["prune"] & names["experiments"] == set()


def _private_names_of_internals() -> set[str]:
    """The private Keras/TensorFlow attribute names prune/_internals.py touches (attributes and getattr strings)."""
    tree = ast.parse((ROOT / "prune" / "_internals.py").read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
             and not n.attr.startswith("__")}
    names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and re.fullmatch(r"_[a-z][a-z_]*", n.value)}
    return names


def test_private_keras_access_only_in_internals():
    """No module but prune/_internals.py reads or writes the private attributes it wraps, or patches a layer's call."""
    private = _private_names_of_internals()
    assert {"_layers", "_trainable_variables", "_non_trainable_variables", "_keras_history", "_value"} <= private
    offenders = []
    for name, path in _modules("prune").items():
        if name == "prune._internals":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "getattr", "hasattr", "setattr", "__setattr__"
            ):
                strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                hits = [s for s in strings if s in private or s == "call"]
                hits += [a.values[0].value for a in node.args if isinstance(a, ast.JoinedStr) and a.values  # f"_{name}"
                         and isinstance(a.values[0], ast.Constant) and str(a.values[0].value).startswith("_")]
                if hits:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {hits}")
    assert offenders == []


ENGINE = ["prune.core.schedules", "prune.core.patterns", "prune.core.scoring", "prune.core.distributions", "prune.core.masks", "prune.core.targets",
          "prune.core.notices"]


def _child(code: str) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", "import json, sys\n" + code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_engine_imports_without_tensorflow_or_keras():
    """``import prune`` and the NumPy-only engine load no TensorFlow and no Keras; the registries answer."""
    out = _child(
        "import prune\n" + "".join(f"import {m}\n" for m in ENGINE)
        + "from prune.core.distributions import distributions\n"
        + "s = prune.PolynomialDecay(0.0, 0.8, 0, 10, frequency=2)\n"
        + "print(json.dumps(dict(heavy=sorted(m for m in ('tensorflow', 'keras', 'pandas') if m in sys.modules),\n"
        + "  sparsity=float(s(10)[1]), criteria=prune.criteria(), distributions=distributions(),\n"
        + "  gradient=prune.criteria(needs='gradient'), block=repr(prune.Block((1, 4))))))"
    )
    assert out["heavy"] == []
    assert out["sparsity"] == pytest.approx(0.8) and out["distributions"] == ["layer", "global", "erk"]
    assert out["gradient"] == ["gradient", "movement", "snip", "taylor"] and "magnitude" in out["criteria"]


def test_keras_side_loads_on_first_use_and_registers_for_loading():
    """The first Keras-side name loads it; once Keras is imported a .keras file with prune's layers loads."""
    out = _child(
        "import prune\n"
        "before = 'keras' in sys.modules\n"
        "fn = prune.prune_low_magnitude\n"
        "import keras\n"
        "m = keras.models.load_model('tests/fixtures/compat/masked.keras')\n"
        "print(json.dumps(dict(before=before, after='keras' in sys.modules, layers=[type(l).__name__ for l in m.layers])))"
    )
    assert out == {"before": False, "after": True, "layers": ["MaskedConv2D", "Flatten", "MaskedDense", "MaskedDense"]}


def test_keras_side_registers_after_a_find_spec_that_imports_nothing():
    """``import tensorflow`` asks ``importlib.util.find_spec("keras")`` before Keras is imported: prune's Keras side
    must still register when Keras then loads. (It did not: a runner worker imports prune first, and its
    ``MultiHeadAttention`` layers stayed dense with a "no masked class" warning.)"""
    out = _child(
        "import importlib.util\n"
        "import prune\n"
        "spec = importlib.util.find_spec('keras')\n"
        "asked = 'keras' in sys.modules\n"
        "import tensorflow\n"
        "import keras\n"
        "from prune.layers import registry\n"
        "twin = registry.masked_class_for(keras.layers.MultiHeadAttention(2, 4))\n"
        "print(json.dumps(dict(asked=asked, more='prune.layers.masked_more' in sys.modules,\n"
        "  twin=getattr(twin, '__name__', None))))"
    )
    assert out == {"asked": False, "more": True, "twin": "MaskedMultiHeadAttention"}


def test_a_runner_worker_prunes_attention():
    """A runner worker (prune imported before TensorFlow, then ``init_process``) masks ``MultiHeadAttention``."""
    out = _child(
        "from experiments import run_one\n"
        "run_one.init_process('keras3', 1)\n"
        "import keras, prune\n"
        "x = keras.Input((4, 8))\n"
        "model = keras.Model(x, keras.layers.MultiHeadAttention(2, 4, name='attn')(x, x))\n"
        "masked = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.5, 0))\n"
        "print(json.dumps(dict(attn=type(masked.get_layer('attn')).__name__)))"
    )
    assert out == {"attn": "MaskedMultiHeadAttention"}


# -- prune's folders import one way ------------------------------------------------------------------------------------

# A folder may import the folders listed for it (and prune's top-level modules: the lazy public names, _lazy,
# _internals; api only from deploy), never one above it: core <- algorithms <- layers <- training <- deploy.
FOLDER_ORDER = {
    "core": set(),
    "algorithms": {"core"},
    "native": {"core"},
    "layers": {"core", "native", "algorithms"},
    "training": {"core", "native", "algorithms", "layers"},
    "deploy": {"core", "native", "algorithms", "layers", "training"},
}


def _folder_imports(package: Path) -> dict[tuple[str, str], list[str]]:
    """``{(from_folder, to_folder): [module imports name, ...]}`` over every import in ``package``, functions included."""
    import ast

    folders = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found: dict[tuple[str, str], list[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        src = parts[0] if len(parts) > 1 else None
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                bits = name.split(".")
                if bits[0] != package.name or len(bits) < 2 or bits[1] not in folders | {"api"}:
                    continue
                dst = bits[1]
                if src is not None and dst != src:
                    found.setdefault((src, dst), []).append(f"{'/'.join(parts)} imports {name}")
    return found


def test_prune_folders_import_one_way():
    found = _folder_imports(ROOT / "prune")
    assert set(FOLDER_ORDER) <= {src for src, _ in found} | set(FOLDER_ORDER)  # every folder is listed
    bad = [line for (src, dst), lines in sorted(found.items())
           if dst not in FOLDER_ORDER.get(src, set()) and not (dst == "api" and src == "deploy") for line in lines]
    assert not bad, "\n".join(bad)


def test_the_folder_check_finds_an_upward_import(tmp_path):
    pkg = tmp_path / "prune"
    for folder, body in (("core", "from prune.layers import thing\n"), ("layers", "")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "mod.py").write_text(body)
    assert _folder_imports(pkg) == {("core", "layers"): ["core/mod.py imports prune.layers",
                                                         "core/mod.py imports prune.layers.thing"]}
