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
* ``sparse_tensor``: the masked model is built and pruned by the same schedule,
  and training runs a ``prune.layers.SparseDense`` model made by
  ``prune.convert(masked, to="sparse", matmul=...)``. If the converted layers carry
  masks themselves (they are prunable layers), ``UpdatePruningStep`` drives them
  exactly as in ``masked``. Otherwise the sparse structure is fixed between mask
  updates: at each scheduled update step the trained values are copied back into
  the masked model, its masks are updated, and it is compacted again into a new
  sparse model. The optimizer then starts afresh (its slots belonged to the old
  nonzeros), which ``masked`` and ``tfmot`` do not do; with a one-shot schedule
  there is a single compaction and the difference disappears. Only layers that
  ``convert`` makes sparse run sparse matmuls (Dense kernels); others stay masked
  or dense as ``convert`` decides.
* ``tfmot`` (:mod:`experiments.tfmot_baseline`): tfmot's own wrapper under tf-keras
  in a separate legacy-Keras process. tfmot updates masks inside the compiled
  train step (a ``tf.cond`` on its step counter) instead of in a Python callback,
  and its step counter starts at -1 before the callback first sets it; the mask
  decisions per step match ours (``prune``'s schedules reproduce tfmot's numbers).
  tfmot's ``OneShot`` does not exist: it is ``ConstantSparsity(begin, end=begin)``.
  Its inference is timed after ``strip_pruning`` (how tfmot models are deployed),
  with dense kernels containing zeros. Op-level kernels differ between Keras 3 and
  tf-keras, so its accuracy agrees with ``masked`` closely but not bitwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from experiments.config import RunConfig
from experiments.data import Data
from experiments.models import build, initial_weights, layer_positions
from experiments.train import latency_ms, make_optimizer, steps_per_epoch, train, weight_report

__all__ = ["train_keras3", "library_schedule", "schedule_args"]


def schedule_args(run: RunConfig, spe: int) -> tuple[str, dict[str, Any]]:
    """The schedule of ``run`` as (class name, step-based arguments) shared by prune and tfmot."""
    s = run.schedule
    assert s is not None  # dense runs have none and never ask
    begin, end = s.steps(spe)
    if s.kind == "polynomial":
        return "PolynomialDecay", dict(
            initial_sparsity=s.initial_sparsity,
            final_sparsity=run.sparsity,
            begin_step=begin,
            end_step=end,
            power=s.power,
            frequency=s.frequency,
        )
    if s.kind == "constant":
        return "ConstantSparsity", dict(target_sparsity=run.sparsity, begin_step=begin, end_step=end, frequency=s.frequency)
    return "OneShot", dict(sparsity=run.sparsity, step=begin)


def library_schedule(run: RunConfig, spe: int) -> Any:
    """The ``prune`` schedule object for ``run``."""
    import prune

    name, args = schedule_args(run, spe)
    return getattr(prune, name)(**args)


def _kernels(model: Any) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Dense kernels of a plain model, by layer name."""
    return {layer.name: [("kernel", np.asarray(layer.kernel.numpy()))] for layer in model.layers if hasattr(layer, "kernel")}


def _variable_bytes(model: Any) -> int:
    return int(sum(np.asarray(v.numpy()).nbytes for v in model.weights))


def train_keras3(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Train ``run`` with Keras 3 and measure it.

    Returns:
        A dict with ``final``, ``curves``, ``step_times``, ``fit_seconds``,
        ``eval_seconds``, ``report`` (DataFrame), ``model_bytes``,
        ``checkpoint_bytes``, ``latency_b1_ms``, ``latency_b256_ms``.
    """
    import keras
    import tensorflow as tf

    import prune

    keras.backend.clear_session()
    keras.utils.set_random_seed(run.seed)
    tf.config.experimental.enable_op_determinism()

    plain = build(run.model, data.input_shape, data.n_classes, keras)
    plain.set_weights(initial_weights(plain, run.seed))
    positions = layer_positions(plain)
    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)
    impl = run.implementation.name

    def compile_model(m: Any) -> None:
        m.compile(make_optimizer(run.training, keras), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    boundaries: list[int] = []
    at_boundary = None
    callbacks: list[Any] = []
    if impl == "dense":
        model = plain
    elif impl == "masked":
        model = prune.prune_low_magnitude(plain, library_schedule(run, spe), seed=run.seed)
        callbacks = [prune.UpdatePruningStep()]
    elif impl == "sparse_tensor":
        model, callbacks, boundaries, at_boundary = _sparse_tensor_setup(run, plain, spe, compile_model, log)
    else:
        raise ValueError(f"implementation {impl!r} does not run in a Keras 3 process")
    compile_model(model)

    result = train(model, data, run, keras, callbacks, log, compile_model, boundaries, at_boundary)
    model = result.model

    # The deployed form and its dense equivalent (for nnz and FLOPs).
    if impl == "dense":
        dense_equiv = model
        status = "dense"
    elif impl == "masked":
        dense_equiv = prune.strip_pruning(model)
        status = "pruned"
    else:
        from prune.convert import convert

        dense_equiv = convert(model, to="dense")
        status = "pruned"
    report = weight_report(
        [
            (layer, w, value, positions.get(layer, 1.0), status)
            for layer, ws in _kernels(dense_equiv).items()
            for w, value in ws
        ]
    )
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    lat1 = latency_ms(predict, data.x_test, 1)
    lat256 = latency_ms(predict, data.x_test, 256)
    ckpt = run_dir / "checkpoint.weights.h5"
    model.save_weights(str(ckpt))
    return dict(
        final=result.final,
        curves=result.curves,
        step_times=result.step_times,
        fit_seconds=result.fit_seconds,
        eval_seconds=result.eval_seconds,
        report=report,
        model_bytes=_variable_bytes(model),
        checkpoint_bytes=ckpt.stat().st_size,
        latency_b1_ms=lat1,
        latency_b256_ms=lat256,
        keras_impl="keras",
    )


def _sparse_tensor_setup(
    run: RunConfig, plain: Any, spe: int, compile_model: Callable[[Any], None], log: Callable[[str], None]
) -> tuple[Any, list[Any], list[int], Any]:
    """Build the masked model and its SparseDense twin; see the module docstring."""
    import prune
    from prune.convert import convert  # written beside this runner; imported lazily

    schedule = library_schedule(run, spe)
    matmul = run.implementation.matmul
    masked = prune.prune_low_magnitude(plain, schedule, seed=run.seed)
    sparse = convert(masked, to="sparse", matmul=matmul)
    if prune.prunable_layers(sparse):
        # The sparse layers carry masks and a schedule: they compact themselves at updates.
        log("sparse_tensor: converted layers are prunable; UpdatePruningStep drives them")
        return sparse, [prune.UpdatePruningStep()], [], None

    total = spe * run.training.epochs
    updates = [s for s in range(total) if schedule(s)[0]]
    log(f"sparse_tensor: fixed structure between mask updates; compacting at {len(updates)} steps")

    def at_boundary(step: int, current: Any) -> tuple[Any, list[Any]]:
        # Copy trained values back into the masked model, update masks, compact again.
        values = {layer.name: layer for layer in convert(current, to="dense").layers}
        for layer in masked.layers:
            src = values.get(layer.name)
            if src is None or not src.weights:
                continue
            by_name = {v.name: v for v in src.weights}
            for var in layer.weights:
                if var.name in by_name:
                    var.assign(by_name[var.name].value)
        prune.update_masks(masked, step)
        new = convert(masked, to="sparse", matmul=matmul)
        compile_model(new)
        return new, []

    return sparse, [], updates, at_boundary
