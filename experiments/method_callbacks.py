"""What each method does to a Keras 3 model: the ``keras`` entries of :data:`experiments.axes.METHODS`.

A ``keras`` function gets the run, its data, the compiled sparse model (masked
or SparseDense layers), the steps per epoch and the run's folder, installs the
method's masks and returns ``(callbacks, finish)``: the callbacks that move the
masks during :func:`experiments.train.train`, and a function called after
training (``None`` if there is nothing to do), e.g. to write the mask history.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Callable

from experiments.config import RunConfig
from experiments.data import Data
from experiments.store import atomic_write
from experiments.tables import MASK_UPDATE_COLUMNS

from experiments.library_names import DST_DISTRIBUTION, SPARSE_TRAINING

__all__ = ["scheduled", "sparse_training"]


def scheduled(run: RunConfig, data: Data, model: Any, spe: int, run_dir: Path) -> tuple[list[Any], None]:
    """``gmp``, ``one_shot``, ``snip``: the layers carry the schedule; ``prune.UpdatePruningStep`` applies it."""
    from experiments.implementations import update_step

    return [update_step(run, data)], None


def sparse_training(
    run: RunConfig, data: Data, model: Any, spe: int, run_dir: Path
) -> tuple[list[Any], Callable[[], None]]:
    """The sparse-training methods (``static``, ``set``, ``rigl``, ``mest``, ``granet``: every algorithm of
    :mod:`prune.algorithms`): a random mask from step 0 (:func:`prune.sparse_init`, at the run's sparsity, or at
    the algorithm's :meth:`~prune.algorithms.SparseTraining.start_sparsity`: GraNet's ``initial_sparsity``), then
    :class:`prune.DynamicSparsity` running the algorithm, for those that move masks.

    The gradient of the algorithms that need one (RigL's growth, MEST's drop, GraNet's regeneration) is taken on
    the run's fixed gradient batch (:func:`experiments.implementations.fixed_batch`), the same at every update,
    as the gradient criteria are, or with ``gradient_batch = "current"`` on the
    batch the update's step trains on (:func:`experiments.train.current_batch`),
    as rigl's code does. ``drop = "per_sign"`` is SET's own drop. ``end`` is
    a fraction of the run's training steps. ``finish`` writes
    ``run_dir/mask_updates.csv``: one row per update and weight (``step, key,
    live, dropped, grown, changed_fraction = dropped / live``); static
    training writes the header only.
    """
    import prune

    from experiments.axes import sparse_training_algorithm
    from experiments.implementations import fixed_batch

    algorithm_class = SPARSE_TRAINING[run.method.name]
    callbacks: list[Any] = []
    start = run.sparsity
    if algorithm_class.moves:
        import keras

        from experiments.train import current_batch

        p = run.method.params
        total = spe * run.training.epochs
        algorithm = sparse_training_algorithm(run.method.name, p, run.sparsity, end_step=max(1, int(round(p.end * total))),
                                              seed=run.seed)
        start = algorithm.start_sparsity(run.sparsity)
        gradient_data = None
        if algorithm.needs_gradient:
            if p.gradient_batch == "current":
                gradient_data = current_batch(keras, run.training.batch_size)
                callbacks.append(gradient_data)  # before DynamicSparsity: it knows the batch when the update asks
            else:
                gradient_data = fixed_batch(run, data)
        callbacks.append(prune.DynamicSparsity(algorithm, gradient_data=gradient_data))
    prune.sparse_init(model, start, distribution=DST_DISTRIBUTION[run.distribution], seed=run.seed)

    def finish() -> None:
        history = callbacks[-1].history if callbacks else []
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(MASK_UPDATE_COLUMNS)
        for r in history:
            live = r["live"]
            writer.writerow([r["step"], r["key"], live, r["dropped"], r["grown"], repr(r["dropped"] / live if live else 0.0)])
        atomic_write(Path(run_dir) / "mask_updates.csv", out.getvalue())

    return callbacks, finish
