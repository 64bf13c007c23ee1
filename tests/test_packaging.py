"""Packaging: the library runs without the extras, the requirements are split, the Pythons agree.

A library user installs ``prune-keras`` alone (TensorFlow, Keras, numpy, pandas); the runner, the
tfmot baseline and the tests come with extras. The first test runs the library in a child process in
which every extra's top-level module fails to import, as it would after ``pip install prune-keras``.
"""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXTRA_MODULES = ["matplotlib", "PIL", "sklearn", "mlxtend", "tqdm", "dask", "distributed",
                 "tensorflow_model_optimization", "tf_keras", "pytest", "nbclient", "experiments"]

CHILD = f"""
import importlib.abc, json, sys
BLOCKED = {EXTRA_MODULES!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed (library-only install)")
        return None

sys.meta_path.insert(0, Block())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
import numpy as np
import keras
import prune
from prune.layers.sparse import SparseDense

rng = np.random.default_rng(0)
x, y = rng.standard_normal((64, 12)).astype("float32"), rng.integers(0, 3, 64)
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
pruned = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.75, begin_step=0, frequency=1))
pruned.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
pruned.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[prune.UpdatePruningStep()])
stripped = prune.strip_pruning(pruned)
report = prune.sparsity_report(pruned)
kernels = [np.asarray(layer.kernel) for layer in stripped.layers]
sparse = SparseDense.from_dense(rng.standard_normal((12, 5)).astype("float32"), rng.random((12, 5)) > 0.5)
print(json.dumps(dict(sparsity=[float((k == 0).mean()) for k in kernels], rows=len(report), out=list(sparse(x[:2]).shape),
                      loaded=sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED)))))
"""


def test_the_library_runs_without_any_extra():
    """Prune, train with the callback, report, and run SparseDense with none of the extras importable."""
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin",
                               "HOME": str(Path.home())})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == [] and out["out"] == [2, 5]
    assert out["sparsity"] == [0.75, 0.75] and out["rows"] >= 2, out


def _cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _names(block: str) -> set[str]:
    lines = [ln.split("#")[0].strip() for ln in block.splitlines()]
    return {re.split(r"[<>=!~\[;\s]", ln, maxsplit=1)[0].lower() for ln in lines if ln}


def test_requirements_are_split_into_the_library_and_extras():
    cfg = _cfg()
    assert cfg["metadata"]["name"] == "prune-keras"  # `prune` on the public index is an unrelated package
    assert _names(cfg["options"]["install_requires"]) == {"tensorflow", "keras", "numpy", "pandas"}
    extras = {k: _names(v) for k, v in cfg["options.extras_require"].items()}
    assert {"experiments", "tfmot", "dev"} <= set(extras)
    assert {"tensorflow-model-optimization", "tf-keras"} == extras["tfmot"]
    assert {"matplotlib", "pillow", "dask", "scikit-learn", "scipy", "mlxtend", "tqdm"} <= extras["experiments"]
    # exact figure pins live in the constraints file only
    pins = [ln for ln in (ROOT / "constraints" / "figures.txt").read_text().splitlines() if "==" in ln.split("#")[0]]
    assert {p.split("==")[0] for p in pins} == {"matplotlib", "pillow", "fonttools"}  # fonttools: the PDFs' embedded fonts
    assert "==" not in cfg["options.extras_require"]["experiments"]


def test_supported_pythons_agree_with_the_multi_python_runner():
    """python_requires, the classifiers and the noxfile name the same CPythons (TensorFlow 2.21's, from Keras 3.15's 3.11)."""
    cfg = _cfg()
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", cfg["options"]["python_requires"].replace(" ", "")).groups()
    versions = [f"3.{m}" for m in range(int(low), int(high))]
    assert versions == ["3.11", "3.12", "3.13"]
    classifiers = re.findall(r"Python :: (3\.\d+)", cfg["metadata"]["classifiers"])
    nox = re.search(r"PYTHONS = (\[.*\])", (ROOT / "noxfile.py").read_text()).group(1)
    assert classifiers == versions == json.loads(nox)
    assert f"3.{sys.version_info.minor}" in versions
