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
import numpy as np
import tensorflow as tf

from prune.core.scoring import get_criterion
from prune.training.gradients import batch_of, compute_gradients
from prune.training.pruning import prunable_entries, prunable_layers, stepped_layers, update_masks
from prune.core.driving import attach, detach, guard_compiled_step, notify

__all__ = ["UpdatePruningStep", "apply_masked_gradients", "mask_gradients"]

_ALIGNMENTS = {"prune": 0, "tfmot": 1}  # step_alignment -> offset of the step the schedules are asked about


class UpdatePruningStep(keras.callbacks.Callback):
    """Advance the pruning step and update masks when the schedule says so.

    Drives every prunable layer through the one engine, :func:`prune.update_masks`
    (masked layers write masks, weights and slots; ``SparseDense`` layers shrink
    their values, indices and optimizer slots); when a sparse layer had to
    replace optimizer state, the compiled train function is rebuilt.

    The step counter lives in each masked layer's ``pruning_step`` variable,
    which the layer advances inside the compiled step on every training-mode
    call; so it is saved and restored with the model and training resumes where
    it stopped. Before each batch the schedules are evaluated at the current
    step (in Python) and, where one fires, masks are recomputed and the pruned
    entries of weights and optimizer slots are set to zero.

    Under ``model.compile(steps_per_execution=k)`` the hooks run once per k
    steps; the step is taken from the layers' counter and the batch index, so
    the schedule still sees true training steps, and ``fit`` refuses before
    training (``ValueError``) when a scheduled update would fall inside an
    execution. A model built lazily by its first step (no ``keras.Input``) gets
    its step-0 update right after that step (the first step trains unmasked);
    build it first for an exact step 0.

    Training a model with scheduled masks without this callback raises a
    ``ValueError`` when the training step is built, as in tfmot (see
    :mod:`prune.core.driving` for why it raises rather than adds itself), and so
    does a later ``fit`` that reuses the compiled step of a ``fit`` that had
    it. On a model with nothing to prune (only ``DepthwiseConv2D`` layers, or
    a pruning policy that selected nothing) the callback does nothing, as
    tfmot's.

    Args:
        optimizer: Optimizer whose slots to reset; defaults to ``model.optimizer``.
        gradient_data: ``(x, y)``, or a callable returning one, on which
            gradients are computed (:func:`prune.compute_gradients`) whenever a
            schedule fires for a criterion that needs them (SNIP, Taylor,
            movement). Required for those criteria.
        loss: ``loss(y_true, y_pred)`` for those gradients; default the model's
            compiled loss.
        step_alignment: ``"prune"`` (default): before training step ``k``
            (counted from 0) the schedules are asked about step ``k``, so
            ``begin_step=b`` prunes before the ``b``-th batch. ``"tfmot"``:
            they are asked about step ``k + 1``, as tfmot's wrapper does
            (it increments its counter before evaluating the schedule), so a
            run reproduces tfmot's mask updates step for step; a schedule
            step 0 is then never evaluated, as in tfmot.

    Raises:
        ValueError: ``step_alignment`` is not ``"prune"`` or ``"tfmot"``.
    """

    def __init__(
        self, optimizer: Any = None, gradient_data: Any = None, loss: Any = None, *, step_alignment: str = "prune"
    ) -> None:
        if step_alignment not in _ALIGNMENTS:
            raise ValueError(f"step_alignment must be 'prune' or 'tfmot', got {step_alignment!r}")
        super().__init__()
        self.step_alignment = step_alignment
        self._offset = _ALIGNMENTS[step_alignment]
        self._started = False
        self._optimizer = optimizer
        self._gradient_data = gradient_data
        self._loss = loss
        self._step = 0
        self._pending: int | None = None
        self._layers: list[Any] = []
        self._fit_start = 0
        self._epoch_start: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._started = True
        self._layers = stepped_layers(self.model)
        if not self._layers:
            return  # nothing to prune: nothing to do, as in tfmot
        built = [layer for layer in self._layers if layer.built]
        self._step = int(built[0].pruning_step.numpy()) if built else 0
        self._fit_start = self._step
        self._epoch_start = None
        self._check_execution_boundaries()
        attach(self._layers)

    def _steps_per_execution(self) -> int:
        spe = getattr(self.model, "steps_per_execution", 1)
        return int(spe) if isinstance(spe, (int, np.integer)) and spe > 0 else 1

    def _check_execution_boundaries(self) -> None:
        """Refuse, before training, a ``steps_per_execution`` that would move a mask update.

        ``fit`` calls the batch hooks once per execution of ``k =
        steps_per_execution`` steps, so masks can change only at steps
        ``fit_start + e * steps + j * k`` (``e`` epochs in, ``j * k < steps``).
        The run is exact when every step at which a schedule updates falls on
        such a boundary (e.g. ``begin_step`` and ``frequency`` multiples of
        ``k`` that divides the epoch length); otherwise no choice of when to
        update reproduces ``steps_per_execution=1``, and this raises.
        """
        k = self._steps_per_execution()
        if k == 1 or not self.params:
            return
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        if not steps or not epochs:
            raise ValueError(
                f"steps_per_execution={k}: UpdatePruningStep needs a known number of steps per epoch to check that "
                "every mask update falls between executions; pass `steps_per_epoch` to fit, or compile with "
                "steps_per_execution=1"
            )
        epochs_left = int(epochs) - int(self.params.get("initial_epoch", 0) or 0)
        schedules = {id(s): s for s in (getattr(layer, "pruning_schedule", None) for layer in self._layers) if s}
        for offset in range(int(steps) * max(1, epochs_left)):
            if offset % int(steps) % k == 0:
                continue  # a boundary: the update runs exactly there
            step = self._fit_start + offset
            for schedule in schedules.values():
                if schedule.should_update(step + self._offset):
                    raise ValueError(
                        f"steps_per_execution={k} cannot honour the pruning schedule {schedule!r}: it updates masks "
                        f"at step {step}, inside an execution of {k} steps (masks change only between executions, "
                        f"at steps {self._fit_start} + epoch * {steps} + a multiple of {k}). Compile with "
                        "steps_per_execution=1, or choose begin_step, end_step and frequency that are multiples of "
                        f"{k} with {k} dividing the {steps} steps of an epoch"
                    )

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
        step += self._offset  # the step the schedules are asked about (see step_alignment)
        gradients = None
        entries = prunable_entries(self.model)
        needing = sorted({e.criterion for e in entries if "gradient" in get_criterion(e.criterion).needs})
        if needing and any(e.schedule.should_update(step) for e in entries):
            x, y = batch_of(self._gradient_data, f"criteria {needing}")
            gradients = compute_gradients(self.model, x, y, loss=self._loss)
        result = update_masks(self.model, step, self._optim(), gradients=gradients)
        if result.retrace and getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)

    def _optim(self) -> Any:
        return self._optimizer if self._optimizer is not None else getattr(self.model, "optimizer", None)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # All work happens here, none in on_train_batch_end: Keras 3 runs
        # callbacks asynchronously only while no callback overrides a batch-end
        # hook, and overriding one (or writing a variable eagerly every step)
        # measured +1.5 ms per LeNet-300-100 step. The saved counters advance
        # inside the compiled step instead (PrunableLayer.advance_step).
        if not self._started:  # used in a custom loop without on_train_begin
            self.on_train_begin()
        if not self._layers:
            return
        if self.params:
            # In fit, ``batch`` is the first step of this execution within the
            # epoch (steps_per_execution > 1 calls this once per k steps); the
            # epoch's first step is read from the layers' counter, once per epoch.
            if batch == 0 or self._epoch_start is None:
                built = [layer for layer in self._layers if layer.built]
                self._epoch_start = (int(built[0].pruning_step.numpy()) if built else self._step) - batch
            self._step = self._epoch_start + batch
        if any(not layer.built for layer in self._layers):
            # A lazily built model builds its layers inside this first step, so
            # there is no mask yet: the update for this step runs before the next
            # step or when training ends, whichever comes first.
            if self._pending is None:
                self._pending = self._step
        else:
            self._apply_pending()
            self._update(self._step)
            notify(self.model, self._step)  # PruningSummaries logs the masks now, after the update
        self._step += 1

    def _apply_pending(self) -> None:
        if self._pending is not None and all(layer.built for layer in self._layers):
            pending, self._pending = self._pending, None
            self._update(pending)

    def on_train_end(self, logs: dict | None = None) -> None:
        # A lazily built model whose fit was a single step still gets its step-0 update.
        try:
            self._apply_pending()
        finally:
            detach(self._layers)
            guard_compiled_step(self.model, self._layers)
            self._started = False


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
