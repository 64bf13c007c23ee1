"""TensorBoard summaries of pruning, and tfmot's ``prune_scope``.

:class:`PruningSummaries` is tfmot's callback of the same name: at the start
of each epoch, once that step's mask update has run, it writes each masked
weight's sparsity and magnitude threshold as ``tf.summary`` scalars to
``<log_dir>/metrics``, at step ``model.optimizer.iterations``, and once more
when training ends, with the final masks. View them with::

    tensorboard --logdir <log_dir>
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prune.core.driving import is_driven, listen, unlisten
from prune.training.pruning import get_step, prunable_layers, stepped_layers

__all__ = ["PruningSummaries", "prune_scope", "pruning_scalars"]


def pruning_scalars(model: Any) -> dict[str, float]:
    """``{"<layer>/<weight>/sparsity": s, "<layer>/<weight>/threshold": t}`` for every masked weight.

    ``sparsity`` is the fraction of zeros in the mask. ``threshold`` is the
    magnitude threshold of the mask, as tfmot logs it: the smallest ``|w|``
    among the kept entries, or 0.0 while nothing is pruned (tfmot's initial
    value). Unbuilt layers are skipped.
    """
    out: dict[str, float] = {}
    for layer in prunable_layers(model):
        if not layer.built:
            continue
        for name in layer.prunable_weight_names:
            weight, mask = layer.weight_and_mask(name)
            keep = np.asarray(mask.numpy()) != 0
            values = np.abs(np.asarray(weight.numpy()))[keep]
            pruned = keep.size - int(keep.sum())
            out[f"{layer.name}/{name}/sparsity"] = float(pruned / keep.size) if keep.size else 0.0
            out[f"{layer.name}/{name}/threshold"] = float(values.min()) if pruned and values.size else 0.0
    return out


def _scalar_metadata() -> bytes:
    """TensorBoard's scalar-plugin metadata, as ``tensorboard.summary.scalar`` writes it (plugin data version 0)."""
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata.SerializeToString()


class PruningSummaries(keras.callbacks.Callback):
    """Log the sparsity and threshold of every mask for TensorBoard, at the start of each epoch and at the end.

    As tfmot's callback of the same name, the scalars of
    :func:`pruning_scalars` go to ``<log_dir>/metrics``, at step
    ``model.optimizer.iterations`` (the pruning step when the model has no
    optimizer), written with ``tf.summary`` under TensorBoard's scalar plugin.

    When the masks are logged: tfmot updates them inside the training step,
    so at the start of an epoch at step ``k`` its masks already hold the
    update for step ``k``. Here :class:`prune.UpdatePruningStep` updates them
    before batch ``k``, after ``on_epoch_begin``; so while an
    ``UpdatePruningStep`` drives the model, the epoch's scalars are written
    right after its update for step ``k`` (in whichever order the two
    callbacks were given), and the curve matches tfmot's. With nothing
    driving the masks they are written at ``on_epoch_begin``. When training
    ends, the final masks are logged at the final step, which tfmot never
    logs.

    Unlike tfmot's, it is not a ``keras.callbacks.TensorBoard``: it logs the
    pruning scalars only. Add ``keras.callbacks.TensorBoard(log_dir)`` beside
    it for losses and metrics. Two reasons: Keras 3's ``TensorBoard`` needs
    the ``tensorboard`` package to write anything (``prune`` does not depend
    on it; ``tf.summary.write`` is part of TensorFlow), and it overrides
    ``on_train_batch_end``, which turns off Keras 3's asynchronous callback
    dispatch for the whole ``fit`` (see ``prune/training/callbacks.py``).

    Args:
        log_dir: Directory of the event files, a non-empty string.
        update_freq: Only ``"epoch"`` (tfmot's default; the pruning scalars
            are written per epoch there too).

    Raises:
        ValueError: ``log_dir`` is not a non-empty string, ``update_freq`` is
            not ``"epoch"``, or a ``keras.callbacks.TensorBoard`` argument is
            given (use that callback for them).
    """

    def __init__(self, log_dir: str, update_freq: str = "epoch", **kwargs: Any) -> None:
        if not isinstance(log_dir, str) or not log_dir:
            raise ValueError(f"`log_dir` must be a non-empty string. You passed `log_dir`={log_dir!r}.")
        if update_freq != "epoch":
            raise ValueError(
                f"update_freq must be 'epoch' (pruning scalars are logged per epoch), got {update_freq!r}; for "
                "per-batch losses add keras.callbacks.TensorBoard(log_dir, update_freq=...) beside PruningSummaries"
            )
        if kwargs:
            raise ValueError(
                f"PruningSummaries logs pruning scalars only and takes no TensorBoard arguments, got {sorted(kwargs)}; "
                "pass them to a keras.callbacks.TensorBoard beside it"
            )
        super().__init__()
        self.log_dir = log_dir
        self.update_freq = update_freq
        self._writer: Any = None
        self._pending = False  # an epoch's scalars wait for the driver's mask update
        self._last_step: int | None = None

    def _step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "iterations", None) is not None:
            return int(np.asarray(optimizer.iterations))
        return get_step(self.model)

    def _write(self) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir + "/metrics")
        step = self._step()
        metadata = _scalar_metadata()
        with self._writer.as_default():
            for name, value in pruning_scalars(self.model).items():
                tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=metadata)
        self._writer.flush()
        self._pending, self._last_step = False, step

    def _after_update(self, step: int) -> None:
        if self._pending:
            self._write()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if any(is_driven(layer) for layer in stepped_layers(self.model)):
            self._pending = True  # written by _after_update, once the driver has updated this step's masks
            listen(self.model, self._after_update)
        else:
            self._write()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._pending:  # the driver never ran a step this epoch
            self._write()

    def on_train_end(self, logs: dict | None = None) -> None:
        unlisten(self.model, self._after_update)
        if self._pending or self._last_step != self._step():
            self._write()  # the final masks
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def prune_scope() -> Any:
    """tfmot's ``prune_scope``: a custom-object scope holding the masked layer and schedule classes.

    Not needed here: every class ``prune`` saves is registered with Keras, so
    ``keras.models.load_model`` finds them without it. It exists so that tfmot
    code written as ``with prune_scope(): load_model(path)`` runs unchanged.
    """
    from prune.layers.kinds import MASKED_TWINS  # the registered masked classes, user ones included
    from prune.core.schedules import _REGISTRY

    objects = {cls.__name__: cls for cls in MASKED_TWINS.values()}
    objects.update(_REGISTRY)
    return keras.saving.custom_object_scope(objects)
