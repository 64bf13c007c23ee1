"""The Keras 3 implementations: ``dense``, ``masked`` and ``sparse_tensor``.

What differs between implementations, and why
----------------------------------------------
All four start from the same numpy-initialised weights (:func:`experiments.models.initial_weights`),
see the same examples in the same order (:func:`experiments.train.train`), use the
same optimizer settings and the same schedule numbers in steps. They differ in:

* ``dense``: no pruning at all; it ignores sparsity and schedule and runs once per
  seed. The reference for accuracy and speed.
* ``masked``: ``prune.prune_low_magnitude`` + ``prune.UpdatePruningStep``. Masks
  are updated before the step whose number the schedule names; the forward pass
  multiplies by the mask, pruned weights and their optimizer slots are +0.0.
  Inference is timed on the masked model as it is (weight * mask, dense matmul):
  that is what a user of the masked layers runs.
* ``sparse_tensor``: the masked model is built with the same schedule and
  converted at the start by ``prune.convert(masked, to="sparse", matmul=...)``:
  Dense layers become ``prune.layers.SparseDense`` (values at indices; with the
  initial all-ones mask every entry is stored), carrying the schedule, and
  ``prune.UpdatePruningStep`` compacts them at each mask update (values, indices and
  optimizer slots shrink), so memory and matmul work fall as sparsity rises.
  Mask selection is the same exact top-k as ``masked``; the products differ only
  in summation order (sparse kernels), so accuracy agrees closely, not bitwise.
  ``Conv2D`` layers become ``prune.layers.SparseConv2D`` (since the commit that
  added it; runs recorded before it kept lenet5's convolutions masked). Layers
  without a sparse form (``DepthwiseConv2D``, ``Conv1D``) stay masked. Inference
  is timed on the sparse model.
* ``tfmot`` (:mod:`experiments.tfmot_baseline`): tfmot's own wrapper under tf-keras
  in a separate legacy-Keras process. tfmot updates masks inside the compiled
  train step (a ``tf.cond`` on its step counter) instead of in a Python callback,
  and it increments its counter *before* evaluating the schedule, so during the
  k-th batch (from 0) it asks the schedule about step k+1 while ``prune`` asks
  about step k. The baseline therefore shifts tfmot's ``begin_step`` and
  ``end_step`` by +1, so both update masks before the same batch, to the same
  sparsity (``prune``'s schedules reproduce tfmot's numbers); without the shift
  a schedule starting at step 0 would start a step late in tfmot and a one-shot
  at step 0 would never fire. tfmot has no one-shot schedule: it is
  ``ConstantSparsity(begin_step=b, end_step=b, frequency=1)``. tfmot picks its
  threshold by ``tf.math.top_k`` on magnitudes; ties at the threshold can
  resolve differently from ``prune``'s exact top-k.
  Its inference is timed after ``strip_pruning`` (how tfmot models are deployed),
  with dense kernels containing zeros. Op-level kernels differ between Keras 3 and
  tf-keras, so its accuracy agrees with ``masked`` closely but not bitwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from experiments import axes
from experiments.axes import schedule_args
from experiments.config import RunConfig
from experiments.library_names import GRADIENT_CRITERIA
from experiments.data import Data
from experiments.models import seeded_model
from experiments.axis_registry import resolve
from experiments.steps import steps_per_epoch
from experiments.train import make_optimizer, measure_keras3, train

__all__ = [
    "train_keras3",
    "library_schedule",
    "pruning_kwargs",
    "fixed_batch",
    "gradient_batch",
    "update_step",
    "masked_model",
    "sparse_model",
    "strip_masked",
    "sparse_to_dense",
]


def library_schedule(run: RunConfig, spe: int) -> Any:
    """The ``prune`` schedule object for ``run``."""
    import prune

    name, args = schedule_args(run, spe)
    return getattr(prune, name)(**args)


def pruning_kwargs(run: RunConfig) -> dict[str, Any]:
    """``prune_low_magnitude``'s ``pattern``, ``criterion``, ``scope`` and ``seed`` for ``run``.

    At the defaults (unstructured, magnitude, layer) these are prune's own
    defaults, so a run made before the axes existed is reproduced exactly.
    """
    return dict(**run.pattern.library_kwargs(), criterion=run.criterion_used, scope=run.distribution, seed=run.seed)


def output_policy(run: RunConfig, plain: Any) -> dict[str, Any]:
    """``{"pruning_policy": prune.KeepDense([...])}`` naming the layers the run keeps dense, else ``{}``.

    Those are the model's own (``keep_dense``: mobilenet's first convolution) and, when ``run.output_layer ==
    "dense"``, the output layer.
    """
    from experiments import axes

    kept = list(axes.MODELS.get(run.model.name).keep_dense)
    if run.output_layer == "dense":
        kept.append([layer.name for layer in plain.layers if hasattr(layer, "kernel")][-1])
    if not kept:
        return {}
    import prune

    return {"pruning_policy": prune.KeepDense(kept)}


def fixed_batch(run: RunConfig, data: Data) -> tuple[np.ndarray, np.ndarray]:
    """The first ``batch_size`` training examples: the batch every gradient score of a run is taken on."""
    n = run.training.batch_size
    return data.x_train[:n], data.y_train[:n]


def gradient_batch(run: RunConfig, data: Data) -> tuple[np.ndarray, np.ndarray] | None:
    """The fixed batch a gradient criterion scores on (:func:`fixed_batch`); ``None`` for the others.

    The same batch at every mask update and in every implementation, so SNIP
    (Lee et al., ICLR 2019), Taylor and movement scores do not depend on where
    the data order is.
    """
    return fixed_batch(run, data) if run.criterion_used in GRADIENT_CRITERIA else None


def update_step(run: RunConfig, data: Data) -> Any:
    """``prune.UpdatePruningStep``, with :func:`gradient_batch` when the criterion needs gradients."""
    import prune

    return prune.UpdatePruningStep(gradient_data=gradient_batch(run, data))


def masked_model(run: RunConfig, data: Data, plain: Any, spe: int) -> Any:
    """``prune.prune_low_magnitude`` with the run's schedule (prune's default for methods without one)."""
    import prune

    schedule = library_schedule(run, spe) if run.schedule_used() is not None else None
    return prune.prune_low_magnitude(plain, schedule, **pruning_kwargs(run), **output_policy(run, plain))


def sparse_where_pruned(masked: Any, matmul: str) -> Any:
    """``prune.convert(masked, to="sparse")`` with the layers that carry no mask back to plain ``Dense``/``Conv2D``.

    ``convert`` alone stores a plain layer sparse too (its nonzeros, here every entry, with no schedule); the layers a
    run keeps dense (:func:`output_policy`) stay plain instead. ``masked`` is a Sequential model.
    """
    import keras

    import prune
    from prune.deploy.convert import convert  # written beside this runner; imported lazily
    from prune.layers.sparse import SparseDense

    pruned = {layer.name for layer in prune.prunable_layers(masked)}
    sparse = convert(masked, to="sparse", matmul=matmul)
    if not any(isinstance(layer, SparseDense) and layer.name not in pruned for layer in sparse.layers):
        return sparse
    layers = [layer.to_dense_layer() if isinstance(layer, SparseDense) and layer.name not in pruned else layer
              for layer in sparse.layers]
    return keras.Sequential([keras.Input(shape=tuple(masked.input_shape[1:])), *layers], name=sparse.name)


def sparse_model(run: RunConfig, data: Data, plain: Any, spe: int) -> Any:
    """The masked model converted to SparseDense and SparseConv2D layers (compacted at mask updates), the layers the
    run keeps dense plain (:func:`sparse_where_pruned`)."""
    from prune.layers.sparse import sparse_layers

    sparse = sparse_where_pruned(masked_model(run, data, plain, spe), run.implementation.matmul)
    layers = sparse_layers(sparse)
    if not layers or (run.schedule_used() is not None and any(layer.pruning_schedule is None for layer in layers)):
        raise RuntimeError("prune.convert(to='sparse') gave no SparseDense layer carrying the pruning schedule")
    return sparse


def strip_masked(model: Any) -> Any:
    """The masked model with its masks applied and removed (``prune.strip_pruning``)."""
    import prune

    return prune.strip_pruning(model)


def sparse_to_dense(model: Any) -> Any:
    """The SparseDense model as plain Dense layers (``prune.convert(to="dense")``)."""
    from prune.deploy.convert import convert

    return convert(model, to="dense")


def train_keras3(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Train ``run`` with Keras 3 and measure it.

    The implementation's ``build`` (:data:`experiments.axes.IMPLEMENTATIONS`)
    makes the plain model sparse; the run's method (``keras`` of
    :data:`experiments.axes.METHODS`) installs its masks and returns the
    callbacks that move them; the implementation's ``deployed`` gives the dense
    equivalent for the weight report.

    Returns:
        A dict with ``final``, ``curves``, ``step_times``, ``fit_seconds``,
        ``eval_seconds``, ``report`` (DataFrame), ``model_bytes``,
        ``checkpoint_bytes``, ``latency_b1_ms``, ``latency_b256_ms``, and
        ``kernels`` (the final dense kernels by layer, zeros in place).
    """
    import keras

    plain, positions = seeded_model(run, data, keras)
    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)
    impl = axes.IMPLEMENTATIONS.get(run.implementation.name)
    if impl.process != "keras3":
        raise ValueError(f"implementation {impl.name!r} does not run in a Keras 3 process")
    model = resolve(impl.build)(run, data, plain, spe) if impl.build else plain
    model.compile(make_optimizer(run.training, keras, spe), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks: list[Any] = []
    finish: Callable[[], None] | None = None
    if impl.prunes:
        callbacks, finish = resolve(run.method.spec.keras)(run, data, model, spe, run_dir)

    result = train(model, data, run, keras, callbacks, log)
    model = result.model
    if finish is not None:
        finish()

    # The deployed form's dense equivalent (for nnz and FLOPs); latency and checkpoint of the model itself.
    dense_equiv = resolve(impl.deployed)(model) if impl.deployed else model
    status = "pruned" if impl.prunes else "dense"
    out = measure_keras3(result, model, dense_equiv, positions, status, data.x_test, run_dir / "checkpoint.weights.h5")
    if impl.takes_matmul:  # the kernels it actually ran on, and the native build's flags when that ran
        from prune import native

        out["native_kernel"] = native.kernel_label(run.implementation.matmul)
        out["native_flags"] = native.status().flags if out["native_kernel"].startswith("native") else ""
    return out
