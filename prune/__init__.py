"""prune: sparse and pruned networks on Keras 3.

Schedules produce binary masks stored beside the weights; a masked training
step keeps pruned weights at exactly zero under every optimizer.

``import prune`` imports no TensorFlow and no Keras: the engine (schedules,
patterns, criteria, distributions, mask selection, mask targets) is NumPy
only, and the rest loads on first use of one of its names (PEP 562), so the
experiment runner's main process can read the library's registries. Once
Keras is imported, by the user or by prune, prune's layer classes register
themselves with Keras's serialisation (a ``.keras`` file holding them loads
after ``import prune``), and once TensorFlow is imported a native op library
already built for this machine is loaded (a saved graph holding its ops
loads); see :mod:`prune._lazy`.

``import prune`` never imports tensorflow_model_optimization: importing tfmot
sets ``TF_USE_LEGACY_KERAS=1`` for the whole process. No module of ``prune``
imports it (tfmot's schedules are accepted by duck typing); only the experiment
runner's baseline, ``experiments/tfmot_baseline.py``, does, in a process of
its own.

``import prune`` sets ``TF_ENABLE_ONEDNN_SPMM=1`` unless it is already set.
TensorFlow then runs ``SparseMatrixMatMul`` (the CSR kernel of
:mod:`prune.layers.kernels`) through oneDNN inside compiled graphs too, as it
already does eagerly; its default graph kernel, Eigen's, was measured 2.1x
slower (1024x1024 at 90% sparsity, batch 256: 1.28 ms against 0.61 ms). The
variable touches nothing else. TensorFlow reads it once, the first time it
compiles a graph holding that op, so import ``prune`` before building such a
graph; set ``TF_ENABLE_ONEDNN_SPMM=0`` to keep Eigen's kernel.
"""

import os as _os
import sys as _sys

_os.environ.setdefault("TF_ENABLE_ONEDNN_SPMM", "1")

from prune import _lazy
from prune.core.notices import PruningWarning
from prune.core.patterns import Block, Channel, NByM, Unstructured
from prune.core.schedules import ConstantSparsity, OneShot, PolynomialDecay, PruningSchedule, register_schedule
from prune.core.scoring import ScoreContext, criteria, register_criterion

__version__ = "0.1.0"

_KERAS_SIDE = {
    "prune.training.dst": ["DynamicSparsity", "sparse_init"],
    "prune.training.gradients": ["compute_gradients", "dense_gradients"],
    "prune.deploy.convert": ["ConversionWarning", "convert", "unconvertible_layers"],
    "prune.api": ["is_pruned", "prune_low_magnitude", "strip_pruning", "unsupported_layers"],
    "prune.layers.freezing": ["CapRowNorm", "DropRows", "FrozenEntries", "LazyAdam", "entry_stop_gradients", "freeze_entries",
                       "transform_slices"],
    "prune.layers.masked": ["PrunableLayer", "PruneLowMagnitude"],
    "prune.training.pruning": ["get_step", "prunable_layers", "update_masks"],
    "prune.deploy.oneshot": ["oneshot"],
    "prune.layers.registry": ["register_prunable"],
    "prune.deploy.report": ["sparsity_report"],
    "prune.deploy.shrink": ["shrink", "shrink_report"],
    "prune.training.policy": ["KeepDense", "PruneForLatencyOnXNNPack", "PruningPolicy"],
    "prune.training.summaries": ["PruningSummaries", "prune_scope"],
    "prune.training.callbacks": ["UpdatePruningStep", "apply_masked_gradients", "mask_gradients"],
}
"""Names loaded on first use, by the module that defines them (they import TensorFlow and Keras)."""
_LAZY = {name: module for module, names in _KERAS_SIDE.items() for name in names}
_SUBMODULES = {"embeddings": "prune.layers.embeddings", "export": "prune.deploy.export", "lottery": "prune.training.lottery"}
"""Public modules reachable as ``prune.<name>`` on first use (``prune.export.to_tflite``), by their one home."""

__all__ = sorted(
    ["PruningWarning", "Block", "Channel", "NByM", "Unstructured", "ConstantSparsity", "OneShot", "PolynomialDecay",
     "PruningSchedule", "register_schedule", "ScoreContext", "criteria", "register_criterion", *_LAZY, *_SUBMODULES]
)


def __getattr__(name: str) -> object:
    import importlib
    import importlib.util

    _lazy.settle()
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    elif not name.startswith("_") and importlib.util.find_spec(f"prune.{name}") is not None:
        value = importlib.import_module(f"prune.{name}")  # a subpackage or module: prune.core, prune.training, ...
    else:
        raise AttributeError(f"module 'prune' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


_lazy.install()
