"""``prune.oneshot``: prune a trained model once, layer by layer, from calibration data (magnitude, Wanda, SparseGPT).

This runs after training, not during it: the methods are :mod:`prune.algorithms`' kind ``"oneshot"``
(:mod:`prune.algorithms.oneshot`, ``wanda``, ``sparsegpt``). Calibration is sequential, as SparseGPT's code
runs it (``opt_sequential``): the model's top-level layers (a transformer block, an attention layer, a Dense
layer) are taken in order; for each, one pass over the calibration batches through the model, whose earlier
layers are already pruned, records the inputs of every pruned weight in it into
:class:`~prune.algorithms.oneshot.InputStatistics` (summed batch by batch: the activations are never held),
then its weights are pruned. Weights inside one top-level layer (the query, key and value projections of one
attention layer) are calibrated together, on the inputs their layer receives.

Pruned layer kinds, each through a 2-D view ``W`` of shape ``[d_in, d_out]`` with ``y = x W``:

* ``Dense``: the kernel; the inputs' last axis;
* ``Conv1D``, ``Conv2D`` (``groups=1``, ``channels_last``): the patch matrix ``[kh * kw * C_in, C_out]`` (the
  kernel read row-major), and the inputs' patches (``tf.image.extract_patches``, the layer's strides,
  dilation and padding);
* ``EinsumDense`` whose contracted axes are the input's last and the kernel's first (``abc,cde->abde``,
  ``abcd,cde->abe``): the kernel flattened to ``[d_in, d_out]``;
* ``MultiHeadAttention``: the query, key, value and output projections, each such an ``EinsumDense``. A
  subclass (KerasHub's ``CachedMultiHeadAttention``) is pruned through its projections, as ``EinsumDense``
  layers.

Blocks of a nested functional model (a KerasHub backbone's ``TransformerDecoder`` layers) are calibrated one
after the other, as the top-level layers are.

The result is an ordinary pruned model (:func:`prune.prune_low_magnitude`'s clone): masks beside the weights,
pruned weights exactly 0.0, each layer under ``ConstantSparsity(sparsity, begin_step=0)`` with the unstructured
pattern, so that fine-tuning under :class:`prune.UpdatePruningStep` keeps the one-shot mask wherever it
prunes ``round(sparsity * n)`` entries (unstructured ``scope="layer"``; N:M when ``d_in`` is a multiple of
``n``): masks only shrink, and pruned entries rank below every live one. It converts, strips, saves and
exports as any pruned model.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from prune.algorithms.base import Update, get_algorithm
from prune.algorithms.oneshot import InputStatistics, OneShotPruning
from prune.core.notices import PruningWarning

__all__ = ["oneshot", "ONESHOT_KINDS"]

ONESHOT_KINDS = ("Dense", "Conv1D", "Conv2D", "EinsumDense", "MultiHeadAttention")
"""The layer kinds :func:`oneshot` prunes (their masked twins: ``MaskedDense`` ...)."""


def _batches(data: Any, batch_size: int) -> list[Any]:
    """The calibration inputs as a list of batches: an array (split into ``batch_size`` rows), or an iterable of
    batches (arrays, or ``(x, y)`` / ``(x, y, w)`` tuples, of which ``x`` is taken)."""
    import tensorflow as tf

    if isinstance(data, (np.ndarray, tf.Tensor)) or hasattr(data, "__array__") and not isinstance(data, (list, tuple)):
        x = np.asarray(data)
        if x.ndim == 0 or x.shape[0] == 0:
            raise ValueError(f"data must hold at least one calibration example, got an array of shape {x.shape}")
        return [x[i:i + batch_size] for i in range(0, x.shape[0], batch_size)]
    if isinstance(data, dict):
        raise ValueError("data must be an array of inputs or an iterable of batches; a dict of inputs goes in a list")
    try:
        items = list(data)
    except TypeError:
        raise ValueError(f"data must be an array of inputs or an iterable of batches, got {type(data).__name__}") from None
    out = [b[0] if isinstance(b, tuple) and len(b) in (2, 3) else b for b in items]
    if not out:
        raise ValueError("data must hold at least one calibration batch, got none")
    return out


def _check_shapes(model: Any, batches: list[Any]) -> None:
    """Each batch fits the model's (single) input: same rank, same sizes where the model fixes them."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1:
        return  # several inputs: the model's own call checks them
    want = tuple(inputs[0].shape)
    for i, b in enumerate(batches):
        shape = tuple(np.shape(b))
        if len(shape) != len(want) or any(w is not None and w != s for w, s in zip(want[1:], shape[1:])) or shape[0] == 0:
            raise ValueError(f"data batch {i} has shape {shape}; the model takes inputs of shape {want} (non-empty)")


def _layer_filter(layers: Any) -> Callable[[str], bool] | None:
    if layers is None:
        return None
    if isinstance(layers, str):
        pattern = re.compile(layers)
        return lambda name: pattern.fullmatch(name) is not None
    names = list(layers)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"layers must be None, a regular expression or a list of layer names, got {layers!r}")
    wanted = set(names)
    return lambda name: name in wanted


def _kind(layer: Any) -> str | None:
    """The one-shot kind of a plain Keras layer (:data:`ONESHOT_KINDS`), or None."""
    import keras

    if type(layer).__name__ in ("MultiHeadAttention", "MaskedMultiHeadAttention"):
        return "MultiHeadAttention"  # a subclass (KerasHub's) is pruned through its EinsumDense projections
    if type(layer).__name__ in ("EinsumDense", "MaskedEinsumDense"):
        return "EinsumDense"
    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D)) and type(layer).__name__ in (
            "Conv1D", "Conv2D", "MaskedConv1D", "MaskedConv2D"):
        if getattr(layer, "groups", 1) != 1 or getattr(layer, "data_format", "channels_last") != "channels_last":
            return None
        return type(layer).__name__.replace("Masked", "")
    if isinstance(layer, keras.layers.Dense):
        return "Dense"
    return None


class _View:
    """How one weight is seen by a one-shot method: the layer whose call receives ``x``, ``x -> [tokens, d_in]``,
    and the kernel's ``[d_in, d_out]`` view."""

    def __init__(self, target: Any) -> None:
        layer = target.layer
        name = target.key.split("/")[-1].split("#")[0]
        self.shape = tuple(target.weight.shape)
        kind = _kind(layer)
        if kind == "MultiHeadAttention":
            owner = getattr(layer, layer._slots[name][0])
            self.recorder = owner
            self.d_in = _einsum_d_in(owner, self.shape, f"{layer.name}.{name}")
            self.flatten = lambda x: np.reshape(x, (-1, self.d_in))
        elif kind == "EinsumDense":
            self.recorder = layer
            self.d_in = _einsum_d_in(layer, self.shape, f"{layer.name}.{name}")
            self.flatten = lambda x: np.reshape(x, (-1, self.d_in))
        elif kind in ("Conv1D", "Conv2D"):
            self.recorder = layer
            self.d_in = int(np.prod(self.shape[:-1]))
            self.flatten = lambda x: _patches(layer, x, self.d_in)
        elif kind == "Dense":
            self.recorder = layer
            self.d_in = int(self.shape[0])
            if len(self.shape) != 2:
                raise ValueError(f"layer {layer.name!r}: a Dense kernel of shape {self.shape} has no one-shot view")
            self.flatten = lambda x: np.reshape(x, (-1, self.d_in))
        else:
            raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has no one-shot form; oneshot prunes "
                             f"{', '.join(ONESHOT_KINDS)}")

    def view(self, array: np.ndarray) -> np.ndarray:
        return np.reshape(array, (self.d_in, -1))

    def unview(self, array: np.ndarray) -> np.ndarray:
        return np.reshape(array, self.shape)


def _einsum_d_in(owner: Any, shape: tuple[int, ...], where: str) -> int:
    """``d_in`` of an ``EinsumDense`` kernel's matrix (:func:`prune.layers.einsum_form.matrix_shape`)."""
    from prune.layers.einsum_form import matrix_shape

    equation = str(getattr(owner, "equation", ""))
    matrix = matrix_shape(equation, shape)
    if matrix is None:
        raise ValueError(f"{where}: EinsumDense equation {equation!r} does not contract the input's last axes with "
                         "the kernel's first; it has no one-shot view")
    return matrix[0]


def _patches(layer: Any, x: Any, d_in: int) -> np.ndarray:
    """The ``[positions, kh * kw * C_in]`` patches a Conv1D/Conv2D multiplies by its ``[d_in, C_out]`` view."""
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    kernel = tuple(layer.kernel_size)
    strides, rates = tuple(layer.strides), tuple(layer.dilation_rate)
    padding = layer.padding
    if len(kernel) == 1:  # [B, L, C] as [B, 1, L, C]
        if padding == "causal":
            x = tf.pad(x, [[0, 0], [rates[0] * (kernel[0] - 1), 0], [0, 0]])
            padding = "valid"
        x, kernel, strides, rates = x[:, None], (1, kernel[0]), (1, strides[0]), (1, rates[0])
    p = tf.image.extract_patches(x, sizes=[1, *kernel, 1], strides=[1, *strides, 1], rates=[1, *rates, 1],
                                 padding=padding.upper())
    return np.reshape(p.numpy(), (-1, d_in))


@contextlib.contextmanager
def _recording(views: list[tuple[_View, InputStatistics | None]]) -> Iterator[None]:
    """While open, each view's recorder layer adds its input (the first positional argument of ``call``) to the
    view's statistics (:func:`prune._internals.override_call`; ``call`` is restored on exit)."""
    from prune._internals import override_call

    by_layer: dict[int, list[tuple[_View, InputStatistics]]] = {}
    for v, st in views:
        if st is not None:
            by_layer.setdefault(id(v.recorder), []).append((v, st))
    with contextlib.ExitStack() as stack:
        for entries in by_layer.values():
            layer = entries[0][0].recorder
            original = layer.call

            def call(*args: Any, _original: Any = original, _entries: Any = entries, **kwargs: Any) -> Any:
                x = args[0] if args else kwargs.get("inputs", kwargs.get("query"))
                for v, st in _entries:
                    st.add(v.flatten(np.asarray(x)))
                return _original(*args, **kwargs)

            stack.enter_context(override_call(layer, call))
        yield


def _original_name(layer: Any) -> str:
    """The name ``layer`` has in the model given to ``prune_low_magnitude``: a ``PruneLowMagnitude`` wrapper's
    (``prune_low_magnitude_<name>``) is its inner layer's."""
    inner = getattr(layer, "layer", None)
    return inner.name if type(layer).__name__ == "PruneLowMagnitude" and inner is not None else layer.name


def _blocks(model: Any) -> list[Any]:
    """The layers calibrated one after the other: the model's layers, with nested Sequential and functional
    models (a KerasHub backbone) replaced by their own blocks, in order."""
    import keras

    out: list[Any] = []
    for layer in model.layers:
        if isinstance(layer, keras.Sequential) or any(c.__name__ == "Functional" for c in type(layer).__mro__):
            out.extend(_blocks(layer))
        else:
            out.append(layer)
    return out


def oneshot(
    model: Any,
    data: Any = None,
    sparsity: float | None = 0.5,
    method: str = "sparsegpt",
    *,
    pattern: Any = None,
    scope: str | None = None,
    layers: Any = None,
    batch_size: int = 32,
    verbose: bool | None = None,
    **params: Any,
) -> Any:
    """Prune a trained model in one shot: magnitude, Wanda (Sun et al. 2024) or SparseGPT (Frantar & Alistarh 2023).

    Example::

        pruned = prune.oneshot(model, x_train[:256], 0.5, method="wanda")
        pruned = prune.oneshot(model, x_train[:256], method="sparsegpt", pattern=prune.NByM(2, 4))
        pruned.compile(...); pruned.fit(x, y, epochs=1, callbacks=[prune.UpdatePruningStep()])  # fine-tune

    Args:
        model: A Sequential or functional Keras model, trained. It is not changed: the result is a pruned clone.
        data: Calibration inputs: an array (split into ``batch_size`` rows) or an iterable of batches (arrays,
            or ``(x, y)`` tuples). Not needed by ``method="magnitude"``.
        sparsity: Fraction of each pruned weight's entries set to zero, in [0, 1); ``None`` (or ``m / n``) with
            an N:M ``pattern``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"`` (:func:`prune.algorithms.algorithms`
            ``("oneshot")``).
        pattern: ``None``/:class:`prune.Unstructured` or :class:`prune.NByM` (``NByM(2, 4)``: 2 zeros in every
            4 consecutive inputs of each output).
        scope: ``"layer"`` or ``"row"`` (within each output); default the method's (Wanda: ``"row"``).
        layers: Which layers to prune: ``None`` (every layer of a kind in :data:`ONESHOT_KINDS`), a regular
            expression matched against whole layer names, or a list of names.
        batch_size: Rows per calibration batch when ``data`` is an array.
        verbose: Print ``layer i of n`` as each layer is pruned; ``None``: only once a run passes 5 s.
        **params: The method's own settings (SparseGPT: ``blocksize=128``, ``percdamp=0.01``).

    Returns:
        The pruned model: masked layers holding the one-shot masks, pruned weights exactly 0.0.

    Raises:
        ValueError: before any weight changes, for a bad argument, naming it and its value: ``sparsity``
            outside [0, 1), an unknown ``method`` or parameter, missing, empty or wrongly shaped ``data``, a
            ``layers`` that matches nothing or names a layer of a kind one-shot pruning has no form for.
    """
    import keras

    from prune.api import prune_low_magnitude
    from prune.core.schedules import ConstantSparsity
    from prune.core.targets import iter_layers, mask_targets
    from prune.training.policy import KeepDense

    cls = get_algorithm(method, arg="method", kind="oneshot")
    try:
        algo: OneShotPruning = cls(sparsity=sparsity, pattern=pattern, scope=scope, **params)  # type: ignore[call-arg]
    except TypeError as e:
        raise ValueError(f"method {method!r} takes {sorted(cls.own_params)} besides sparsity, pattern and scope: {e}") from None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or model.inputs is None:
        raise ValueError(f"model must be a built Sequential or functional Keras model, got {type(model).__name__}")
    batches: list[Any] = []
    if algo.statistics != "none":
        if data is None:
            raise ValueError(f"data is required by method {method!r} (calibration inputs); got None")
        batches = _batches(data, int(batch_size))
        _check_shapes(model, batches)
    chosen = _layer_filter(layers)
    candidates = [layer for layer in iter_layers(model) if layer is not model and _kind(layer) is not None]
    if chosen is not None:
        named = [layer for layer in iter_layers(model) if layer is not model and chosen(layer.name)]
        if not named:
            raise ValueError(f"layers={layers!r} matches no layer; layers of a kind oneshot prunes: "
                             f"{[layer.name for layer in candidates]}")
        bad = [f"{layer.name} ({type(layer).__name__})" for layer in named if _kind(layer) is None and layer.weights]
        if bad:
            raise ValueError(f"layers={layers!r} names layers oneshot has no form for: {bad}; it prunes "
                             f"{', '.join(ONESHOT_KINDS)}")
        selected = {layer.name for layer in named if _kind(layer) is not None}
    else:
        selected = {layer.name for layer in candidates}
    if not selected:
        raise ValueError(f"model {model.name!r} has no layer oneshot prunes ({', '.join(ONESHOT_KINDS)})")

    schedule = ConstantSparsity(algo.sparsity, begin_step=0)
    everything = prune_low_magnitude(model, schedule)  # what the engine would mask: the rest stays plain
    # The layers that would hold a pruned weight, by their names in `model` (a custom layer with
    # get_prunable_weights() is wrapped, as prune_low_magnitude_<name>; one that returns [] holds none).
    others = sorted({_original_name(t.layer) for t in mask_targets(everything)} - selected)
    skipped = sorted(n for n in others if chosen is None or chosen(n))
    if skipped:
        warnings.warn(f"oneshot leaves these prunable layers dense (no one-shot form): {skipped}", PruningWarning,
                      stacklevel=2)
    del everything
    gc.collect()  # a Keras model is a web of references: free this copy's variables before the next is made
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PruningWarning)  # named above, or chosen by `layers`
        masked = prune_low_magnitude(model, schedule, pruning_policy=KeepDense(others) if others else None)
    targets = [t for t in mask_targets(masked) if t.layer.name in selected]
    blocks = _blocks(masked)
    top = {}
    for layer in blocks:
        for inner in iter_layers(layer):
            top.setdefault(id(inner), layer)
    groups: list[list[Any]] = []
    group_names: list[str] = []
    for layer in blocks:
        group = [t for t in targets if top.get(id(t.layer)) is layer]
        if group:
            groups.append(group)
            group_names.append(layer.name)
    views = {t.key: _View(t) for t in targets}  # refuses a weight with no view before any change

    start = time.perf_counter()
    for gi, group in enumerate(groups):
        stats = {t.key: (InputStatistics(views[t.key].d_in, with_gram=algo.statistics == "gram")
                         if algo.statistics != "none" else None) for t in group}
        if algo.statistics != "none":
            with _recording([(views[t.key], stats[t.key]) for t in group]):
                for b in batches:
                    masked(b, training=False)
        updates = [Update(key=t.key, weight=views[t.key].view(np.asarray(t.weight)),  # its own dtype: each method reads it in float64
                          keep=views[t.key].view(np.asarray(t.keep, bool)), layer=t.layer.name, inputs=stats[t.key])
                   for t in group]
        plans = algo.plan(updates)
        for t, plan in zip(group, plans):
            if plan.weight is not None:
                t.variable.assign(views[t.key].unview(plan.weight).astype(t.variable.dtype))
            t.install(views[t.key].unview(plan.keep))
        elapsed = time.perf_counter() - start
        if verbose or (verbose is None and elapsed > 5.0):
            names = ", ".join(sorted({t.layer.name for t in group}))
            where = names if names == group_names[gi] else f"{group_names[gi]}: {names}"
            print(f"oneshot {method}: layer {gi + 1} of {len(groups)} ({where}) pruned, {elapsed:.1f} s", file=sys.stderr)
    return masked
