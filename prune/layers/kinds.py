"""Registering a layer kind of prune: one call makes it Keras-serialisable, ``prune.layers.<Name>`` and, for a
masked twin, the layer :func:`prune.prune_low_magnitude` puts in place of its plain class.

::

    @register_layer(prunes=keras.layers.Dense)
    class MaskedDense(PrunableLayer, keras.layers.Dense): ...

    @register_layer
    class SparseDense(ScheduledLayer, keras.layers.Layer): ...

A kind defined in a new module also needs that module in
:data:`prune._lazy.SERIALIZABLE`, the modules imported once Keras is (a
module's registrations run only when it is imported).

Imports neither TensorFlow nor Keras at import time.
"""

from __future__ import annotations

from typing import Any

from prune.layers.scheduled import ScheduledLayer

__all__ = ["LAYER_KINDS", "MASKED_TWINS", "register_layer", "register_twin"]

LAYER_KINDS: dict[str, type] = {}
"""Every registered layer kind by class name (``prune.layers.<name>``)."""

MASKED_TWINS: dict[type, type] = {}
"""Plain Keras layer class -> the masked class that prunes it (read by :func:`prune.layers.registry.masked_class_for`)."""


def register_twin(layer_class: type, masked_class: type) -> None:
    """Make ``masked_class`` the masked twin of ``layer_class`` (no Keras registration).

    Sets ``masked_class.base_class`` to ``layer_class`` when it has none.

    Raises:
        ValueError: ``masked_class`` is not a subclass of ``layer_class`` and of :class:`ScheduledLayer`.
    """
    if not (isinstance(masked_class, type) and issubclass(masked_class, ScheduledLayer)):
        raise ValueError(f"masked_class must subclass prune.layers.ScheduledLayer, got {masked_class!r}")
    if not (isinstance(layer_class, type) and issubclass(masked_class, layer_class)):
        raise ValueError(f"masked_class {masked_class.__name__} must subclass layer_class {getattr(layer_class, '__name__', layer_class)}")
    if getattr(masked_class, "base_class", None) is None:
        masked_class.base_class = layer_class  # type: ignore[attr-defined]
    MASKED_TWINS[layer_class] = masked_class


def register_layer(cls: type | None = None, *, prunes: type | None = None) -> Any:
    """Register a layer kind of prune; usable as ``@register_layer`` or ``@register_layer(prunes=...)``.

    The class is registered with ``keras.saving`` as ``"prune>ClassName"``
    (so a ``.keras`` file holding it loads once ``prune`` is imported), and
    listed in :data:`LAYER_KINDS` (so ``prune.layers.ClassName`` finds it).

    Args:
        cls: The layer class.
        prunes: The plain Keras layer class it is the masked twin of, if any
            (:func:`register_twin`).

    Returns:
        ``cls`` (or, without ``cls``, the decorator).

    Raises:
        ValueError: another class is registered under the same name, or ``prunes`` does not fit.
    """

    def register(cls: type) -> type:
        import keras

        taken = LAYER_KINDS.get(cls.__name__)
        if taken is not None and taken is not cls and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"layer kind name {cls.__name__!r} is taken by {taken.__module__}.{taken.__qualname__}")
        if prunes is not None:
            register_twin(prunes, cls)
        keras.saving.register_keras_serializable(package="prune")(cls)
        LAYER_KINDS[cls.__name__] = cls
        return cls

    return register if cls is None else register(cls)
