"""Training with masks: the ``fit`` callback and the custom-loop helpers.

In ``model.fit``::

    model.fit(x, y, callbacks=[prune.UpdatePruningStep()])

In a custom ``tf.GradientTape`` loop, the same callback object drives the
schedule, and :func:`apply_masked_gradients` applies gradients masked::

    step = prune.UpdatePruningStep(optimizer=optimizer)
    step.set_model(model)
    step.on_train_begin()
    for x, y in batches:
        step.on_train_batch_begin(0)          # mask update when the schedule fires
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        prune.apply_masked_gradients(optimizer, zip(grads, model.trainable_variables), model)
        step.on_train_batch_end(0)            # optional: does nothing

The masked layers already zero the gradient of pruned entries (the forward
pass multiplies by the mask); :func:`apply_masked_gradients` additionally masks
gradients that came from elsewhere (e.g. computed against another graph), so
the optimizer never sees a nonzero gradient for a pruned entry.
"""

from __future__ import annotations

from typing import Any, Iterable

import keras
import tensorflow as tf

from prune.driving import attach, detach
from prune.layers.sparse import update_sparse_masks
from prune.pruning import prunable_layers, stepped_layers, update_masks

__all__ = ["UpdatePruningStep", "SparsePruningStep", "apply_masked_gradients", "mask_gradients"]


class UpdatePruningStep(keras.callbacks.Callback):
    """Advance the pruning step and update masks when the schedule says so.

    Drives masked layers (:func:`prune.update_masks`) and ``SparseDense``
    layers (:func:`prune.layers.sparse.update_sparse_masks`, which shrink their
    values, indices and optimizer slots) alike; when a sparse layer had to
    replace optimizer state, the compiled train function is rebuilt.

    The step counter lives in each masked layer's ``pruning_step`` variable,
    which the layer advances inside the compiled step on every training-mode
    call; so it is saved and restored with the model and training resumes where
    it stopped. Before each batch the schedules are evaluated at the current
    step (in Python) and, where one fires, masks are recomputed and the pruned
    entries of weights and optimizer slots are set to zero.

    Training a model with scheduled masks without this callback raises a
    ``ValueError`` when the training step is built, as in tfmot (see
    :mod:`prune.driving` for why it raises rather than adds itself).

    Args:
        optimizer: Optimizer whose slots to reset; defaults to ``model.optimizer``.
    """

    def __init__(self, optimizer: Any = None) -> None:
        super().__init__()
        self._optimizer = optimizer
        self._step = 0
        self._pending: int | None = None
        self._layers: list[Any] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._layers = stepped_layers(self.model)
        if not self._layers:
            raise ValueError(
                f"UpdatePruningStep found no prunable or SparseDense layer in model {self.model.name!r}; "
                "call prune.prune_low_magnitude(model) first"
            )
        built = [layer for layer in self._layers if layer.built]
        self._step = int(built[0].pruning_step.numpy()) if built else 0
        attach(self._layers)

    def on_train_end(self, logs: dict | None = None) -> None:
        detach(self._layers)

    def on_epoch_end(self, batch: int = -1, logs: dict | None = None) -> None:
        """Nothing to do; kept so that tfmot code calling ``on_epoch_end(batch=-1)`` runs unchanged.

        tfmot re-multiplies weights by masks at the end of each epoch, so that
        a saved model holds ``mask * weight``. Here the stored weight is zero
        wherever the mask is, at every step (the masked forward pass gives
        pruned entries a zero gradient and their optimizer slots are zeroed at
        each mask update), so there is nothing to re-apply. The first argument
        is named ``batch`` as in tfmot; ``fit`` passes the epoch there.
        """

    def _update(self, step: int) -> None:
        optimizer = self._optim()
        update_masks(self.model, step, optimizer)
        _, retrace = update_sparse_masks(self.model, step, optimizer)
        if retrace and getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)

    def _optim(self) -> Any:
        return self._optimizer if self._optimizer is not None else getattr(self.model, "optimizer", None)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # All work happens here, none in on_train_batch_end: Keras 3 runs
        # callbacks asynchronously only while no callback overrides a batch-end
        # hook, and overriding one (or writing a variable eagerly every step)
        # measured +1.5 ms per LeNet-300-100 step. The saved counters advance
        # inside the compiled step instead (PrunableLayer.advance_step).
        if not self._layers:  # used in a custom loop without on_train_begin
            self.on_train_begin()
        if any(not layer.built for layer in self._layers):
            # A lazily built model builds its layers inside this first step, so
            # there is no mask yet: the update for this step runs before the next.
            self._pending = self._step
        else:
            if self._pending is not None:
                self._update(self._pending)
                self._pending = None
            self._update(self._step)
        self._step += 1


SparsePruningStep = UpdatePruningStep
"""Former name of the callback for models with ``SparseDense`` layers; the same class."""


def mask_gradients(grads_and_vars: Iterable[tuple[Any, Any]], model: Any) -> list[tuple[Any, Any]]:
    """Multiply each gradient by its variable's mask (others pass unchanged).

    ``IndexedSlices`` gradients (embeddings) stay row-sparse: their values are
    multiplied by the gathered mask rows. Works inside ``tf.function``.
    """
    lookup = {}
    for layer in prunable_layers(model):
        if layer.built:
            for name in layer.prunable_weight_names:
                weight, mask = layer.weight_and_mask(name)
                lookup[id(weight)] = mask
    out = []
    for grad, var in grads_and_vars:
        mask = lookup.get(id(var))
        if grad is not None and mask is not None:
            m = tf.convert_to_tensor(mask.value)
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.IndexedSlices(grad.values * tf.gather(m, grad.indices), grad.indices, grad.dense_shape)
            else:
                grad = grad * tf.cast(m, grad.dtype)
        out.append((grad, var))
    return out


def apply_masked_gradients(optimizer: Any, grads_and_vars: Iterable[tuple[Any, Any]], model: Any) -> None:
    """Mask the gradients of pruned entries, then ``optimizer.apply_gradients``.

    Args:
        optimizer: A Keras 3 optimizer.
        grads_and_vars: ``(gradient, variable)`` pairs, as ``zip(grads, vars)``.
        model: The model (or layer) that owns the masks.
    """
    optimizer.apply_gradients(mask_gradients(grads_and_vars, model))
