"""TensorBoard summaries of pruning, and tfmot's ``prune_scope``.

:class:`PruningSummaries` is tfmot's callback of the same name: a
``keras.callbacks.TensorBoard`` that, at the start of each epoch, also writes
each masked weight's sparsity and magnitude threshold as ``tf.summary``
scalars to ``<log_dir>/metrics``, at step ``model.optimizer.iterations``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prune.pruning import get_step, prunable_layers

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


class PruningSummaries(keras.callbacks.TensorBoard):
    """TensorBoard callback that also logs the sparsity and threshold of every mask.

    As tfmot's: every argument of ``keras.callbacks.TensorBoard`` is accepted,
    and at the start of each epoch the scalars of :func:`pruning_scalars` are
    written to ``<log_dir>/metrics`` at step ``model.optimizer.iterations``
    (the pruning step when the model has no optimizer yet). Like any
    TensorBoard callback it overrides ``on_train_batch_end``, which turns off
    Keras 3's asynchronous callback dispatch; add it when you want the logs,
    not in timed runs.

    Args:
        log_dir: Directory of the event files, a non-empty string.
        update_freq: As in ``keras.callbacks.TensorBoard``; ``"epoch"`` by default.
        **kwargs: Other ``keras.callbacks.TensorBoard`` arguments.

    Raises:
        ValueError: ``log_dir`` is not a non-empty string.
    """

    def __init__(self, log_dir: str, update_freq: str | int = "epoch", **kwargs: Any) -> None:
        if not isinstance(log_dir, str) or not log_dir:
            raise ValueError(f"`log_dir` must be a non-empty string. You passed `log_dir`={log_dir!r}.")
        super().__init__(log_dir=log_dir, update_freq=update_freq, **kwargs)
        self._metrics_writer: Any = None

    def _step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "iterations", None) is not None:
            return int(np.asarray(optimizer.iterations))
        return get_step(self.model)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        if self._metrics_writer is None:
            self._metrics_writer = tf.summary.create_file_writer(self.log_dir + "/metrics")
        step = self._step()
        with self._metrics_writer.as_default():
            for name, value in pruning_scalars(self.model).items():
                tf.summary.scalar(name, value, step=step)
        self._metrics_writer.flush()


def prune_scope() -> Any:
    """tfmot's ``prune_scope``: a custom-object scope holding the masked layer and schedule classes.

    Not needed here: every class ``prune`` saves is registered with Keras, so
    ``keras.models.load_model`` finds them without it. It exists so that tfmot
    code written as ``with prune_scope(): load_model(path)`` runs unchanged.
    """
    from prune.registry import _PRUNABLE  # the registered masked classes, user ones included
    from prune.schedules import _REGISTRY

    objects = {cls.__name__: cls for cls in _PRUNABLE.values()}
    objects.update(_REGISTRY)
    return keras.saving.custom_object_scope(objects)
