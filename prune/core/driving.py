"""Training a scheduled masked layer requires something that drives its schedule.

tfmot raises when a pruned model is trained without its ``UpdatePruningStep``
callback; so does ``prune``, rather than train the model dense, silently.
:class:`prune.UpdatePruningStep` marks the layers it drives in
``on_train_begin`` and unmarks them in ``on_train_end`` (so does
:class:`prune.DynamicSparsity` for the layers it moves); a masked layer or a
``SparseDense`` with a schedule checks the mark when it is called with
``training=True``.

The check costs nothing per step: in ``fit`` and in a ``tf.function`` loop,
the layer's ``call`` runs in Python only while the step is traced, and the
check is a Python attribute read there. So it catches a first ``fit`` (or a
retrace) without the callback, before any step runs. A second ``fit`` that
reuses the step Keras compiled during an earlier ``fit`` runs no Python code
of the layer; for it, the callback's ``on_train_end`` wraps the model's
compiled ``train_function`` in :func:`guard_compiled_step`, a Python check of
the same marks before each call (well under a microsecond per step; the
compiled step itself is untouched, so nothing is retraced).

Why raise rather than add the callback automatically: Keras 3 gives a model no
hook into ``fit``'s callback list, and a patched ``fit`` on the model object
would be lost on ``keras.models.load_model``, the case where a forgotten
callback is most likely.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["attach", "detach", "is_driven", "require_driver", "guard_compiled_step", "listen", "unlisten", "notify"]

_ATTR = "_prune_driven"
_LISTENERS = "_prune_update_listeners"


def attach(layers: Iterable[Any]) -> None:
    """Mark ``layers`` as driven by a pruning callback."""
    for layer in layers:
        object.__setattr__(layer, _ATTR, True)


def detach(layers: Iterable[Any]) -> None:
    """Remove the mark set by :func:`attach`."""
    for layer in layers:
        object.__setattr__(layer, _ATTR, False)


def is_driven(layer: Any) -> bool:
    """Whether a pruning callback drives ``layer`` now (:func:`attach`)."""
    return bool(getattr(layer, _ATTR, False))


def listen(model: Any, fn: Callable[[int], None]) -> None:
    """Call ``fn(step)`` each time the driver of ``model``'s layers has run a step's mask update.

    :class:`prune.PruningSummaries` listens, so that it logs the masks after
    the update, whichever order the callbacks were given in.
    """
    listeners = getattr(model, _LISTENERS, None)
    if listeners is None:
        listeners = []
        object.__setattr__(model, _LISTENERS, listeners)  # a plain list, not tracked by Keras
    if fn not in listeners:
        listeners.append(fn)


def unlisten(model: Any, fn: Callable[[int], None]) -> None:
    """Stop calling ``fn`` (see :func:`listen`)."""
    listeners = getattr(model, _LISTENERS, None) or []
    if fn in listeners:
        listeners.remove(fn)


def notify(model: Any, step: int) -> None:
    """Tell the listeners of ``model`` that the mask update before training step ``step`` has run."""
    for fn in list(getattr(model, _LISTENERS, None) or []):
        fn(step)


def require_driver(layer: Any) -> None:
    """Raise if ``layer`` has a schedule and no callback drives it.

    Raises:
        ValueError: naming the layer and the callback to add.
    """
    if getattr(layer, "pruning_schedule", None) is not None and not is_driven(layer):
        raise ValueError(
            f"layer {layer.name!r} is pruned with a schedule but is being trained without prune.UpdatePruningStep, "
            "so its masks would never be updated: pass callbacks=[prune.UpdatePruningStep()] to fit, or in a custom "
            "loop call step.set_model(model) and step.on_train_begin() first (see prune.UpdatePruningStep)"
        )


def guard_compiled_step(model: Any, layers: Iterable[Any]) -> None:
    """Make ``model``'s compiled train step refuse to run while a scheduled layer has no driver.

    Keras reuses ``model.train_function`` from one ``fit`` (or
    ``train_on_batch``) to the next until the model is compiled again; this
    replaces it by a Python function that calls :func:`require_driver` for
    each scheduled layer in ``layers`` and then the compiled step. Guarding a
    guarded function, or a model without one, does nothing.
    """
    step = getattr(model, "train_function", None)
    scheduled = [layer for layer in layers if getattr(layer, "pruning_schedule", None) is not None]
    if step is None or getattr(step, "_prune_guarded", False) or not scheduled:
        return

    def guarded(*args: Any, **kwargs: Any) -> Any:
        for layer in scheduled:
            require_driver(layer)
        return step(*args, **kwargs)

    guarded._prune_guarded = True  # type: ignore[attr-defined]
    guarded.__wrapped__ = step  # type: ignore[attr-defined]
    model.train_function = guarded
