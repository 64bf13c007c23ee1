"""prune: sparse and pruned networks on Keras 3.

Schedules produce binary masks stored beside the weights; a masked training
step keeps pruned weights at exactly zero under every optimizer.

``import prune`` never imports tensorflow_model_optimization: importing tfmot
sets ``TF_USE_LEGACY_KERAS=1`` for the whole process. tfmot is only touched in
:mod:`prune.interop`, lazily, and its baseline runs in a separate process.

``import prune`` sets ``TF_ENABLE_ONEDNN_SPMM=1`` unless it is already set.
TensorFlow then runs ``SparseMatrixMatMul`` (the CSR kernel of
:mod:`prune.kernels`) through oneDNN inside compiled graphs too, as it
already does eagerly; its default graph kernel, Eigen's, was measured 2.1x
slower (1024x1024 at 90% sparsity, batch 256: 1.28 ms against 0.61 ms). The
variable touches nothing else. TensorFlow reads it once, the first time it
compiles a graph holding that op, so import ``prune`` before building such a
graph; set ``TF_ENABLE_ONEDNN_SPMM=0`` to keep Eigen's kernel.
"""

import os as _os

_os.environ.setdefault("TF_ENABLE_ONEDNN_SPMM", "1")

from prune import embeddings, export, lottery
from prune.dst import DynamicSparsity, dense_gradients, sparse_init
from prune.convert import ConversionWarning, convert, unconvertible_layers
from prune.notices import PruningWarning
from prune.api import is_pruned, prune_low_magnitude, strip_pruning, unsupported_layers
from prune.freezing import (
    CapRowNorm,
    DropRows,
    FrozenEntries,
    LazyAdam,
    entry_stop_gradients,
    freeze_entries,
    transform_slices,
)
from prune.scoring import ScoreContext, criteria, register_criterion
from prune.layers.masked import PrunableLayer, PruneLowMagnitude
from prune.patterns import Block, Channel, NByM, Unstructured
from prune.pruning import compute_gradients, get_step, prunable_layers, update_masks
from prune.registry import register_prunable
from prune.report import sparsity_report
from prune.shrink import shrink, shrink_report
from prune.layers import masked_more as _masked_more  # registers Conv3D, transposed and separable convs, MHA, RNNs
from prune.policy import PruneForLatencyOnXNNPack, PruningPolicy
from prune.summaries import PruningSummaries, prune_scope
from prune.schedules import (
    ConstantSparsity,
    OneShot,
    PolynomialDecay,
    PruningSchedule,
    register_schedule,
)
from prune.training import UpdatePruningStep, apply_masked_gradients, mask_gradients

from prune import native as _native

_native.load_if_built()  # registers PruneSpmm/PruneSddmm for saved graphs, if built here before (never compiles)

__version__ = "0.1.0"

__all__ = [
    "Block",
    "Channel",
    "ConversionWarning",
    "DynamicSparsity",
    "NByM",
    "PruneLowMagnitude",
    "PruningWarning",
    "ScoreContext",
    "Unstructured",
    "compute_gradients",
    "convert",
    "dense_gradients",
    "unconvertible_layers",
    "CapRowNorm",
    "DropRows",
    "FrozenEntries",
    "LazyAdam",
    "embeddings",
    "export",
    "lottery",
    "entry_stop_gradients",
    "freeze_entries",
    "transform_slices",
    "ConstantSparsity",
    "OneShot",
    "PolynomialDecay",
    "PruningSchedule",
    "PrunableLayer",
    "PruneForLatencyOnXNNPack",
    "PruningPolicy",
    "PruningSummaries",
    "prune_scope",
    "UpdatePruningStep",
    "apply_masked_gradients",
    "criteria",
    "get_step",
    "is_pruned",
    "mask_gradients",
    "prunable_layers",
    "prune_low_magnitude",
    "register_criterion",
    "register_prunable",
    "register_schedule",
    "shrink",
    "sparse_init",
    "shrink_report",
    "sparsity_report",
    "strip_pruning",
    "unsupported_layers",
    "update_masks",
]
