"""The training and measuring loop shared by every implementation.

Nothing here imports Keras or TensorFlow at module level: the Keras module is
passed in, so the same loop drives Keras 3 (dense, masked, sparse_tensor) and
tf-keras (the tfmot baseline in its own process). That keeps the data order,
the optimizer, the measurements and the curves identical across
implementations by construction.

* Data order: one numpy permutation per epoch from the run seed; ``fit`` is
  called once per epoch with ``shuffle=False`` on the permuted arrays.
* Step time: the interval between consecutive ``on_train_batch_end`` calls,
  which includes the pruning callback's mask updates (part of the real cost of
  training a pruned model); the first step of every ``fit`` call and the first
  :data:`WARMUP_STEPS` steps of the run (tracing, allocation) are excluded.
* Latency: a ``tf.function`` around the deployed model's forward pass, warmed up,
  then the median over repeats, at batch 1 and 256.
* Peak memory: the largest resident set size sampled every 20 ms during the run.
* Divergence: when an epoch's training or test loss is NaN or infinite, or
  ``fit`` raises while a weight holds NaN or inf, training stops and
  :class:`Diverged` is raised with the curves so far; the run is recorded with
  status ``diverged`` (a result, kept out of means and standard deviations).
  So is a run whose loss stays finite but explodes: its final training loss
  (the last epoch's mean) more than :data:`DIVERGENCE_FACTOR` times the loss
  of its first batch (before any update, ``ln(classes)`` for a fresh
  classifier), checked after the last epoch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import threading
import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from experiments.config import RunConfig, TrainingConfig
from experiments.library_names import REPORT_COLUMNS
from experiments.models import MHA_KERNELS

__all__ = [
    "Diverged",
    "DIVERGENCE_FACTOR",
    "WARMUP_STEPS",
    "TrainResult",
    "learning_rate",
    "make_optimizer",
    "train",
    "latency_ms",
    "run_outcome",
    "RssSampler",
    "dense_kernels",
    "variable_bytes",
    "measure_keras3",
    "weight_report",
    "current_batch",
]

WARMUP_STEPS = 5
DIVERGENCE_FACTOR = 10.0
"""A final training loss above this multiple of the first batch's loss is a diverged run (e.g. 8e23 at lr 1e12)."""
LATENCY_REPEATS = {1: 50, 256: 10}


class Diverged(Exception):
    """Training diverged: the loss (or a weight) became NaN or infinite.

    Attributes:
        curves: Long-format rows ``(epoch, metric, value)`` up to and including the diverged epoch.
        final: The last epoch's metrics (NaN where training failed before measuring them).
        epoch: The epoch (1-based) in which it happened.
    """

    def __init__(self, reason: str, curves: list[tuple[int, str, float]], final: dict[str, float], epoch: int) -> None:
        super().__init__(reason)
        self.curves = curves
        self.final = final
        self.epoch = epoch


def _nonfinite_weight(model: Any) -> str | None:
    """Name of the first weight of ``model`` holding NaN or inf, else ``None``."""
    for w in model.weights:
        value = np.asarray(w.numpy() if hasattr(w, "numpy") else w)
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return getattr(w, "path", None) or w.name
    return None


def learning_rate(config: TrainingConfig, keras: Any, steps_per_epoch: int) -> Any:
    """The step size of ``config``: a float, or a Keras schedule over ``epochs * steps_per_epoch`` steps.

    ``constant``: the learning rate. ``cosine``: ``keras.optimizers.schedules.CosineDecay`` to 0 at the last step
    (Loshchilov and Hutter, "SGDR: Stochastic Gradient Descent with Warm Restarts", ICLR 2017, without restarts).
    ``step``: ``PiecewiseConstantDecay``, x0.1 after step ``total // 2`` and x0.01 after ``3 * total // 4`` (the
    shape of Evci et al.'s RigL schedule). One IMP level is one run of the schedule. Pruned weights stay exactly
    zero under weight decay (a zero shrinks to zero).
    """
    lr = float(config.learning_rate)
    total = int(config.epochs) * int(steps_per_epoch)
    if config.lr_decay == "cosine":
        return keras.optimizers.schedules.CosineDecay(lr, decay_steps=max(total, 1))
    if config.lr_decay == "step":
        return keras.optimizers.schedules.PiecewiseConstantDecay([total // 2, 3 * total // 4], [lr, lr * 0.1, lr * 0.01])
    return lr


def make_optimizer(config: TrainingConfig, keras: Any, steps_per_epoch: int | None = None) -> Any:
    """The optimizer named in ``config``, from the given Keras module (Keras 3, or tf_keras for tfmot).

    Args:
        config: The training settings (optimizer, step size and its decay, weight decay).
        keras: The Keras module the model belongs to.
        steps_per_epoch: Steps in one epoch; needed when ``config.lr_decay`` decays the step size.

    Raises:
        ValueError: a decaying step size without ``steps_per_epoch``.
    """
    if config.lr_decay != "constant" and not steps_per_epoch:
        raise ValueError(f"lr_decay={config.lr_decay!r} needs steps_per_epoch (a positive int), got {steps_per_epoch!r}")
    lr = learning_rate(config, keras, steps_per_epoch or 1)
    extra = {"weight_decay": float(config.weight_decay)} if config.weight_decay else {}
    if config.optimizer == "adam":
        return keras.optimizers.Adam(lr, **extra)
    if config.optimizer == "momentum":
        return keras.optimizers.SGD(lr, momentum=0.9, **extra)
    return keras.optimizers.SGD(lr, **extra)


@dataclasses.dataclass
class TrainResult:
    """What the loop measured.

    Attributes:
        curves: Long-format rows ``(epoch, metric, value)``.
        step_times: Timed step durations in seconds (warm-up excluded).
        fit_seconds: Wall time inside ``fit``.
        eval_seconds: Wall time of the per-epoch test (and validation) evaluations.
        final: Last epoch's ``train_loss, train_accuracy, test_loss, test_accuracy``, and
            ``val_loss, val_accuracy`` when the data has a validation split.
        model: The trained model.
    """

    curves: list[tuple[int, str, float]]
    step_times: list[float]
    fit_seconds: float
    eval_seconds: float
    final: dict[str, float]
    model: Any


def _timer(keras: Any, sink: list[float], skip: list[int]) -> Any:
    class StepTimer(keras.callbacks.Callback):
        """Times consecutive batch ends inside one fit call."""

        def on_train_begin(self, logs: Any = None) -> None:
            self._last = None

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.perf_counter()
            if self._last is not None:
                if skip[0] > 0:
                    skip[0] -= 1
                else:
                    sink.append(now - self._last)
            self._last = now

    return StepTimer()


def _first_loss(keras: Any, sink: list[float]) -> Any:
    class FirstLoss(keras.callbacks.Callback):
        """Records the loss of the run's first batch (the epoch's running mean after one batch is that batch's)."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not sink and logs and "loss" in logs:
                sink.append(float(logs["loss"]))

    return FirstLoss()


def current_batch(keras: Any, batch_size: int) -> Any:
    """A ``fit`` callback that is also a ``gradient_data`` callable: it returns the batch about to be trained.

    :func:`train` hands it each epoch's permuted arrays (its ``epoch_arrays``);
    ``on_train_batch_begin`` records the batch index, so a callback after it in
    the list (:class:`prune.DynamicSparsity`, RigL's grow gradient) that calls
    it gets the examples of the step being taken, as rigl's code does.
    """

    class CurrentBatch(keras.callbacks.Callback):
        """The examples of the step being taken (``__call__``), from the epoch's arrays and the batch index."""

        def __init__(self) -> None:
            super().__init__()
            self.arrays: tuple[np.ndarray, np.ndarray] | None = None
            self.index = 0

        def epoch_arrays(self, x: np.ndarray, y: np.ndarray) -> None:
            self.arrays, self.index = (x, y), 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.index = int(batch)

        def __call__(self) -> tuple[np.ndarray, np.ndarray]:
            if self.arrays is None:
                raise RuntimeError("current_batch: no epoch arrays yet (train() hands them over before each fit)")
            x, y = self.arrays
            lo = self.index * batch_size
            return x[lo : lo + batch_size], y[lo : lo + batch_size]

    return CurrentBatch()


def train(
    model: Any,
    data: Any,
    run: RunConfig,
    keras: Any,
    callbacks: list[Any],
    log: Callable[[str], None],
) -> TrainResult:
    """Train ``model`` for ``run.training.epochs`` epochs and record curves and step times.

    Args:
        model: A compiled model.
        data: :class:`experiments.data.Data`.
        run: The run (seed, training settings).
        keras: The Keras module the model belongs to.
        callbacks: Extra ``fit`` callbacks (the pruning step callback).
        log: Writes one line to the run's log.
    """
    cfg = run.training
    rng = np.random.default_rng([run.seed, 99])
    n = len(data.x_train)
    step_times: list[float] = []
    skip = [WARMUP_STEPS]
    timer = _timer(keras, step_times, skip)
    first: list[float] = []
    first_loss = _first_loss(keras, first)
    curves: list[tuple[int, str, float]] = []
    fit_s = eval_s = 0.0
    final: dict[str, float] = {}
    for epoch in range(cfg.epochs):
        order = rng.permutation(n)
        x, y = data.x_train[order], data.y_train[order]
        for cb in callbacks:
            if hasattr(cb, "epoch_arrays"):  # current_batch: the arrays this epoch's steps slice
                cb.epoch_arrays(x, y)
        t0 = time.perf_counter()
        try:
            hist = model.fit(
                x, y, batch_size=cfg.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[*callbacks, timer, first_loss]
            )
        except Exception as e:  # a diverged model can make a later step fail (e.g. pruning NaN weights)
            bad = _nonfinite_weight(model)
            if bad is None:
                raise
            reason = f"weight {bad} became NaN or infinite in epoch {epoch + 1}, then {type(e).__name__}: {e}"
            log("DIVERGED " + reason)
            raise Diverged(reason[:500], curves, final, epoch + 1) from e
        fit_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        test_loss, test_acc = model.evaluate(data.x_test, data.y_test, batch_size=512, verbose=0)
        final = {
            "train_loss": float(hist.history["loss"][-1]),
            "train_accuracy": float(hist.history["accuracy"][-1]),
            "test_loss": float(test_loss),
            "test_accuracy": float(test_acc),
        }
        if getattr(data, "x_val", None) is not None:
            val_loss, val_acc = model.evaluate(data.x_val, data.y_val, batch_size=512, verbose=0)
            final.update(val_loss=float(val_loss), val_accuracy=float(val_acc))
        eval_s += time.perf_counter() - t0
        curves += [(epoch + 1, k, v) for k, v in final.items()]
        log(f"epoch {epoch + 1}/{cfg.epochs} " + " ".join(f"{k}={v:.4f}" for k, v in final.items()))
        bad_losses = [k for k in ("train_loss", "test_loss") if not math.isfinite(final[k])]
        if bad_losses:
            reason = f"{' and '.join(bad_losses)} {final[bad_losses[0]]} in epoch {epoch + 1}"
            log("DIVERGED " + reason)
            raise Diverged(reason, curves, final, epoch + 1)
    if first and first[0] > 0 and final and final["train_loss"] > DIVERGENCE_FACTOR * first[0]:
        reason = (
            f"final train_loss {final['train_loss']:.4g} is more than {DIVERGENCE_FACTOR:g} x the first batch's "
            f"loss {first[0]:.4g}"
        )
        log("DIVERGED " + reason)
        raise Diverged(reason, curves, final, cfg.epochs)
    return TrainResult(curves, step_times, fit_s, eval_s, final, model)


def latency_ms(predict: Callable[[Any], Any], x: np.ndarray, batch: int) -> float:
    """Median milliseconds of ``predict`` on ``batch`` examples (after warm-up)."""
    import tensorflow as tf

    idx = np.arange(batch) % len(x)
    xb = tf.constant(x[idx])
    for _ in range(3):
        np.asarray(predict(xb))
    times = []
    for _ in range(LATENCY_REPEATS.get(batch, 10)):
        t0 = time.perf_counter()
        np.asarray(predict(xb))
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000.0)


def run_outcome(
    result: TrainResult, report: pd.DataFrame, predict: Callable[[Any], Any], x_test: np.ndarray, saved: Any,
    checkpoint: Any, model_bytes: int, keras_impl: str,
) -> dict[str, Any]:
    """The dict a run returns: training results, weight report, latencies, and the saved checkpoint's size.

    Shared by the Keras 3 implementations and the tfmot process, so both measure latency and
    save their checkpoint the same way.

    Args:
        result: What :func:`train` returned.
        report: :func:`weight_report` of the deployed weights.
        predict: Compiled inference function timed at batch 1 and 256.
        x_test: Inputs to time it on.
        saved: Model whose ``save_weights`` writes ``checkpoint``.
        checkpoint: Path of the ``.weights.h5`` file.
        model_bytes: Bytes of the deployed model's variables.
        keras_impl: ``"keras"`` or ``"tf_keras"``.
    """
    lat1 = latency_ms(predict, x_test, 1)
    lat256 = latency_ms(predict, x_test, 256)
    saved.save_weights(str(checkpoint))
    return dict(
        final=result.final,
        curves=result.curves,
        step_times=result.step_times,
        fit_seconds=result.fit_seconds,
        eval_seconds=result.eval_seconds,
        report=report,
        model_bytes=int(model_bytes),
        checkpoint_bytes=checkpoint.stat().st_size,
        latency_b1_ms=lat1,
        latency_b256_ms=lat256,
        keras_impl=keras_impl,
    )


def dense_kernels(model: Any) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The kernels of a plain (dense-layer) model as numpy arrays, by layer name: ``{layer: [("kernel", array)]}``;
    a ``MultiHeadAttention`` layer's four, ``[("query_kernel", array), ...]``."""
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    for layer in model.layers:
        if hasattr(layer, "kernel"):
            out[layer.name] = [("kernel", np.asarray(layer.kernel.numpy()))]
        elif all(hasattr(layer, f"{p}_dense") for p in MHA_KERNELS):
            out[layer.name] = [(f"{p}_kernel", np.asarray(getattr(layer, f"{p}_dense").kernel.numpy())) for p in MHA_KERNELS]
    return out


def variable_bytes(model: Any) -> int:
    """Bytes of every variable of ``model`` (weights, masks, counters)."""
    return int(sum(np.asarray(v.numpy()).nbytes for v in model.weights))


def measure_keras3(
    result: TrainResult, model: Any, deployed: Any, positions: dict[str, float], status: str, x_test: np.ndarray,
    checkpoint: Any,
) -> dict[str, Any]:
    """:func:`run_outcome` of a trained Keras 3 model, plus ``kernels`` (its final dense kernels by layer, and by
    ``layer/weight`` for an attention layer's).

    The weight report is taken on ``deployed`` (the model's dense equivalent,
    zeros in place), latency on ``model`` itself, which is also what
    ``checkpoint`` saves. Every Keras 3 run measures its result this way
    (:func:`experiments.implementations.train_keras3`, :func:`experiments.imp_runs.train_imp`).

    Args:
        result: What :func:`train` returned.
        model: The trained model, as its users run it.
        deployed: Its dense equivalent.
        positions: Applications per example by layer name (:func:`experiments.models.layer_positions`).
        status: The report's ``status`` column (``"pruned"`` or ``"dense"``).
        x_test: Inputs to time it on.
        checkpoint: Path of the ``.weights.h5`` file.
    """
    import tensorflow as tf

    kernels = dense_kernels(deployed)
    report = weight_report(
        [(layer, w, value, positions.get(f"{layer}/{w}", positions.get(layer, 1.0)), status)
         for layer, ws in kernels.items() for w, value in ws]
    )
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    out = run_outcome(result, report, predict, x_test, model, checkpoint, variable_bytes(model), "keras")
    out["kernels"] = {layer if w == "kernel" else f"{layer}/{w}": value for layer, ws in kernels.items() for w, value in ws}
    return out


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples this process's resident set size in a thread; ``peak`` is the maximum seen.

    A reused worker process keeps memory from earlier runs, so the peak is that
    of the process during this run, not of this run alone.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def weight_report(entries: list[tuple[str, str, np.ndarray, float, str]]) -> pd.DataFrame:
    """Per-weight sparsity rows with the columns of ``prune.sparsity_report`` (:mod:`prune.core.counting`, shared with it).

    Args:
        entries: ``(layer, weight, dense array, applications per example, status)``.
    """
    from prune.core.counting import weight_row

    return pd.DataFrame([weight_row(*entry) for entry in entries], columns=REPORT_COLUMNS)


def configure_threads(intra: int, inter: int = 1) -> tuple[int, int]:
    """Set TensorFlow's thread pools (before TF runs any op) and return what is in force."""
    os.environ.setdefault("OMP_NUM_THREADS", str(intra))
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        pass  # context already initialised (a reused process): keep what it has
    return tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads()
