"""The tfmot baseline: tfmot's ``prune_low_magnitude`` on the same architecture, under tf-keras.

tfmot 0.8.1 refuses Keras 3 models, and importing it sets
``TF_USE_LEGACY_KERAS=1`` for the whole process. So this module runs only in a
process of its own that set ``TF_USE_LEGACY_KERAS=1`` before TensorFlow was
imported: a "legacy" worker of the local pool, or a subprocess started per run
(``python -m experiments.tfmot_baseline RUN_JSON RUN_DIR``, used under Dask,
whose workers already hold Keras 3). The runner's main process never imports
this module's dependencies; it reads tfmot's version with importlib.metadata.

Same as the Keras 3 implementations: data, data order, initial weights (numpy),
optimizer, schedule numbers in steps, the loop and its measurements
(:mod:`experiments.train`). What differs is listed in
:mod:`experiments.implementations`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from experiments import axes, run_one
from experiments.config import RunConfig
from experiments.data import Data
from experiments.models import seeded_model
from experiments.run_one import ensure_legacy_keras
from experiments.steps import steps_per_epoch
from experiments.train import make_optimizer, run_outcome, train, weight_report

__all__ = ["train_tfmot", "tfmot_schedule", "main"]


def tfmot_schedule(run: RunConfig, spe: int, tfmot: Any) -> Any:
    """tfmot's schedule with the numbers of :func:`experiments.axes.schedule_args`.

    Each schedule kind says how its numbers map onto tfmot
    (:attr:`experiments.axes.ScheduleKind.tfmot`): begin and end shifted by one
    step (tfmot evaluates its schedule at step k+1 during batch k), and
    one-shot as a constant schedule active for one step.
    """
    name, args = axes.schedule_args(run, spe)
    tf_name, tf_args = axes.SCHEDULE_KINDS.get(run.schedule_used().kind).tfmot(name, args)
    return getattr(tfmot.sparsity.keras, tf_name)(**tf_args)


def train_tfmot(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Train ``run`` with tfmot under tf-keras; same return value as :func:`experiments.implementations.train_keras3`."""
    ensure_legacy_keras()
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    import tf_keras

    plain, positions = seeded_model(run, data, tf_keras)
    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)
    # pattern: block_size/block_pooling_type or sparsity_m_by_n; criterion and distribution are magnitude
    # and layer, the only ones tfmot has (RunConfig rejects the others before any run starts)
    model = tfmot.sparsity.keras.prune_low_magnitude(
        plain, pruning_schedule=tfmot_schedule(run, spe, tfmot), **run.pattern.tfmot_kwargs()
    )

    def compile_model(m: Any) -> None:
        m.compile(make_optimizer(run.training, tf_keras, spe), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    compile_model(model)
    result = train(model, data, run, tf_keras, [tfmot.sparsity.keras.UpdatePruningStep()], log)
    stripped = tfmot.sparsity.keras.strip_pruning(model)
    report = weight_report(
        [
            (layer.name, "kernel", np.asarray(layer.kernel.numpy()), positions.get(layer.name, 1.0), "pruned")
            for layer in stripped.layers
            if hasattr(layer, "kernel")
        ]
    )
    predict = tf.function(lambda x: stripped(x, training=False), reduce_retracing=True)
    model_bytes = sum(w.nbytes for w in stripped.get_weights())
    # the checkpoint holds the wrapped model: weights, masks, thresholds and step
    return run_outcome(
        result, report, predict, data.x_test, model, run_dir / "checkpoint.weights.h5", model_bytes, "tf_keras"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.tfmot_baseline RUN_JSON RUN_DIR [THREADS]``: one run, result in RUN_DIR/result.json."""
    ensure_legacy_keras()
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3):
        print("usage: python -m experiments.tfmot_baseline RUN_JSON RUN_DIR [THREADS]", file=sys.stderr)
        return 2
    import json

    from experiments.config import from_dict

    payload = json.loads(Path(args[0]).read_text())
    run = from_dict(RunConfig, payload["run"])
    threads = int(args[2]) if len(args) == 3 else 1
    run_one.init_process("legacy", threads)
    run_one.execute(run, Path(args[1]), payload.get("context", {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
