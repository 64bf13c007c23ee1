"""Keras 3 layers of prune, and the contract the pruned ones share.

* :mod:`prune.layers.scheduled`: :class:`PruningParams` and
  :class:`ScheduledLayer`, the contract of every layer the pruning engine
  drives (its schedule, pattern, criterion, scope and seed, and its step
  counter), and the protocol the engine reads it through;
* :mod:`prune.layers.kinds`: :func:`register_layer`, the one call that
  registers a layer kind (Keras serialisation, ``prune.layers.<Name>`` and,
  for a masked twin, the plain class it prunes);
* :mod:`prune.layers.masked`, :mod:`prune.layers.masked_more`: the masked
  twins (``MaskedDense``, ``MaskedConv2D``, ..., ``PruneLowMagnitude``) and
  their mixin :class:`~prune.layers.masked.PrunableLayer`;
  :mod:`prune.layers.sparse`: ``SparseDense``; :mod:`prune.layers.sparse_conv`:
  ``SparseConv2D`` (its subclass over the patch matrix); :mod:`prune.layers.sparse_einsum`: ``SparseEinsumDense``
  (its subclass over an ``EinsumDense`` kernel read as a matrix); :mod:`prune.layers.sparse_attention`:
  ``SparseMultiHeadAttention`` (Keras's attention over four of them); :mod:`prune.layers.frozen`:
  ``PartiallyFrozenEmbedding``.

Every registered kind is an attribute of this package, loaded on first use
(PEP 562) from :data:`prune.layers.kinds.LAYER_KINDS`; importing the package
itself imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import importlib as _importlib
import importlib.util as _importlib_util
from typing import Any

from prune.layers.kinds import LAYER_KINDS, register_layer
from prune.layers.scheduled import PruningParams, ScheduledLayer

_OWN = ["LAYER_KINDS", "PrunableLayer", "PruningParams", "ScheduledLayer", "register_layer"]


def _load_kinds() -> None:
    """Import every module that registers layer kinds (:data:`prune._lazy.SERIALIZABLE`), Keras with them."""
    from prune import _lazy

    _lazy.settle()
    for module in _lazy.SERIALIZABLE:
        _importlib.import_module(module)


def __getattr__(name: str) -> Any:
    if name == "__all__":
        _load_kinds()
        return sorted({*_OWN, *LAYER_KINDS})
    if name.startswith("_"):
        raise AttributeError(f"module 'prune.layers' has no attribute {name!r}")
    if _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")  # a submodule (``from prune.layers import masked``)
    if name == "PrunableLayer":  # the masked layers' mixin, not a kind of its own
        from prune.layers.masked import PrunableLayer

        return PrunableLayer
    _load_kinds()
    if name in LAYER_KINDS:
        return LAYER_KINDS[name]
    raise AttributeError(f"module 'prune.layers' has no attribute {name!r}; layer kinds: {sorted(LAYER_KINDS)}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_OWN, *LAYER_KINDS})
