"""The functional API: ``prune_low_magnitude``, ``strip_pruning``, ``is_pruned``.

Names follow tfmot so that porting is a change of import::

    import prune as sparsity   # was: tfmot.sparsity.keras
    model = sparsity.prune_low_magnitude(model, pruning_schedule=sparsity.PolynomialDecay(0.0, 0.9, 0, 1000))
    model.fit(x, y, callbacks=[sparsity.UpdatePruningStep()])
    final = sparsity.strip_pruning(model)

Sequential and functional models are cloned (as tfmot does), with every
registered layer replaced by its masked twin carrying the same weights.
Subclassed models cannot be re-traced, so their prunable attribute layers are
replaced in place on the same model object, built and with weights copied.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import keras
import numpy as np

from prune._internals import (
    has_sublayers,
    input_shape_arg,
    layer_attributes,
    own_variables,
    replace_tracked_layer,
    sublayers,
)
from prune.layers.blocks import PrunedBlock, is_prune_layer, replaced_sublayers
from prune.layers.masked import (
    PrunableLayer,
    PruneLowMagnitude,
    copy_or_share,
    is_custom_prunable,
    is_masked_layer,
)
from prune.core.distributions import get_distribution
from prune.layers.scheduled import check_pruning_args
from prune.core.notices import PruningWarning
from prune.core.patterns import pattern_from_args
from prune.training.pruning import prunable_layers
from prune.training.policy import PruningPolicy
from prune.layers.registry import keeps_dense, masked_class_for, unsupported
from prune.core.scoring import get_criterion
from prune.core.schedules import ConstantSparsity, as_schedule
from prune.core.targets import iter_layers

__all__ = ["prune_low_magnitude", "strip_pruning", "is_pruned", "unsupported_layers"]


def _copy_built(old: Any, new: Any) -> Any:
    """Build ``new`` like ``old`` and copy every variable ``old`` has into it.

    Variables are paired in order and checked by name and shape. Between a
    plain layer and its masked twin, the masks and the step counter are left
    out of the pairing (:func:`_base_weights`). Names alone would not do: the
    weights of a layer's sublayers share names (``MultiHeadAttention``'s four
    ``kernel``s).
    """
    if not old.built or not old.weights:
        return new  # nothing to copy; Keras builds it on its first call
    if not new.built:  # some layers build in from_config (KerasHub's TransformerDecoder): building twice raises
        build_config = old.get_build_config()
        if build_config is None:
            raise ValueError(f"layer {old.name!r} is built but has no build config; cannot copy it")
        new.build_from_config(build_config)
    source, target = old.weights, new.weights
    if is_masked_layer(new) and not is_masked_layer(old):
        target = _base_weights(new)
    if is_masked_layer(old) and not is_masked_layer(new):
        source = _base_weights(old)
    _copy_variables(source, target, old.name, type(new).__name__)
    return new


def _base_weights(layer: PrunableLayer) -> list[Any]:
    """``layer.weights`` without the masks and the step counter: the plain layer's weights, in its order."""
    extra = {id(layer.weight_and_mask(n)[1]) for n in layer.prunable_weight_names}
    extra.add(id(layer.pruning_step))
    return [w for w in layer.weights if id(w) not in extra]


_AUTO_NAME = re.compile(r"variable(_\d+)?")


def _copy_variables(source: list[Any], target: list[Any], layer_name: str, target_kind: str) -> None:
    if len(target) != len(source):
        raise ValueError(
            f"cannot copy the {len(source)} weights of layer {layer_name!r} into {target_kind}, which has {len(target)}"
        )
    for src, dst in zip(source, target):
        named = not (_AUTO_NAME.fullmatch(src.name) and _AUTO_NAME.fullmatch(dst.name))  # Keras numbers unnamed ones
        if (named and src.name != dst.name) or tuple(src.shape) != tuple(dst.shape):
            raise ValueError(
                f"cannot copy weight {src.name!r} {tuple(src.shape)} of layer {layer_name!r} into "
                f"{dst.name!r} {tuple(dst.shape)} of {target_kind}"
            )
        dst.assign(src.value)


def _clone_layer(layer: Any) -> Any:
    """A new layer of the same class and config, built like ``layer`` and with its weights.

    ``layer`` itself, with a :class:`prune.PruningWarning`, when Keras cannot
    rebuild it from its config (:func:`prune.layers.masked.copy_or_share`).
    """
    if isinstance(layer, keras.layers.InputLayer):
        return layer
    return copy_or_share(layer, lambda: _copy_built(layer, type(layer).from_config(layer.get_config())))


def _to_masked(layer: Any, params: dict[str, Any], kwargs: dict[str, Any] | None = None) -> Any:
    cls = masked_class_for(layer)
    if cls is None:
        if is_custom_prunable(layer):  # tfmot's contract: a layer with get_prunable_weights() is wrapped
            return PruneLowMagnitude.wrap(layer, {**params, **(kwargs or {})})
        return layer
    config = {**layer.get_config(), **params}
    input_shape = input_shape_arg(layer)  # Keras 3 keeps input_shape out of get_config
    if input_shape is not None:
        config["input_shape"] = input_shape
    config.update(kwargs or {})
    try:
        masked = cls.from_config(config)
    except (TypeError, ValueError) as exc:
        if not kwargs:
            raise
        raise ValueError(f"keyword arguments {sorted(kwargs)} do not fit {type(layer).__name__}: {exc}") from exc
    return _copy_built(layer, masked)


def _to_plain(layer: Any) -> Any:
    from prune.layers.sparse import SparseDense  # deferred: its kernels are not needed to prune
    from prune.layers.sparse_attention import SparseMultiHeadAttention

    if isinstance(layer, (SparseDense, SparseMultiHeadAttention)):
        return layer.to_dense_layer()
    if not is_masked_layer(layer):
        return layer
    if isinstance(layer, PruneLowMagnitude):
        return layer.strip()
    plain = _copy_built(layer, layer.base_class.from_config(layer.plain_config(layer.get_config())))
    if not layer.built:
        return plain
    by_id = {id(v): target for v, target in zip(_base_weights(layer), plain.weights)}
    for name in layer.prunable_weight_names:  # +0.0 where pruned, never -0.0
        weight, mask = layer.weight_and_mask(name)
        value = np.asarray(weight.numpy())
        by_id[id(weight)].assign(np.where(mask.numpy() != 0, value, np.zeros_like(value)))
    return plain


def _is_graph_model(model: Any) -> bool:
    # Sequential and functional models (Functional is not public in Keras 3, so match it by name).
    return isinstance(model, keras.Sequential) or any(c.__name__ == "Functional" for c in type(model).__mro__)


def _convert(model: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every layer: clone graph models, rebuild subclassed ones in place.

    ``fn`` maps a layer to its replacement, or returns the layer itself to keep
    it. Inside a cloned graph model, kept layers are copied (with their
    weights), and nested models are converted the same way, so the result
    shares no layer and no variable with ``model``. A subclassed model is
    changed in place, except nested models, which are copies.
    """
    if isinstance(model, keras.layers.Layer) and not isinstance(model, keras.Model):
        return fn(model)
    if _is_graph_model(model):
        return keras.models.clone_model(model, clone_function=_copying(fn))
    _replace_attributes(model, _copying(fn, models_only=True))
    return model


def _copying(fn: Callable[[Any], Any], models_only: bool = False) -> Callable[[Any], Any]:
    """``fn``, recursing into nested models and copying the layers ``fn`` keeps.

    With ``models_only``, kept layers that are not models are returned as they
    are (a subclassed model changed in place keeps its other layers).
    """

    def clone(layer: Any, counterpart: Any = None) -> Any:
        """The converted or copied ``layer``; ``counterpart``, when given, is the same sublayer in a copy of the
        block holding ``layer``, built by the block itself, and is reused (with ``layer``'s weights) for a layer
        kept as it is, so that layers Keras cannot rebuild from their config still copy."""
        if not isinstance(layer, keras.layers.Layer):
            return layer  # a Keras op of a functional model (x + y): stateless, nothing to copy
        if isinstance(layer, keras.Model):
            if _is_graph_model(layer):
                return keras.models.clone_model(layer, clone_function=clone)
            return _copy_subclassed(layer, clone)
        if isinstance(layer, PrunedBlock) and not models_only:
            return _as_block(clone(layer.layer, counterpart))  # unwrapped once nothing of prune's is left in it
        new = fn(layer)
        if new is not layer or models_only:
            return new
        if has_sublayers(layer) and not isinstance(layer, keras.layers.InputLayer):
            return _as_block(_copy_container(layer, clone, _copying(fn, models_only=True), counterpart))
        if counterpart is not None and type(counterpart) is type(layer) and counterpart.built == layer.built:
            return _copy_built(layer, counterpart)
        return _clone_layer(layer)

    return clone


def _as_block(layer: Any) -> Any:
    """``layer`` in a :class:`prune.layers.PrunedBlock` when it holds any of prune's layers (so that it saves
    and loads with them), else ``layer``."""
    if isinstance(layer, (keras.Model, PrunedBlock)) or is_prune_layer(layer) or not any(replaced_sublayers(layer)):
        return layer
    return PrunedBlock(layer)


def _copy_container(layer: Any, clone: Callable[..., Any], in_place: Callable[[Any], Any], shell: Any = None) -> Any:
    """A copy of a layer with sublayers (a custom block, KerasHub's ``TransformerDecoder``), converted.

    The copy (``shell``: ``from_config`` and built, unless the enclosing block's copy already built it) keeps
    its own instances of the sublayers ``fn`` keeps, with the original's weights copied in, and takes
    ``clone`` of the original's sublayer wherever ``fn`` converts one (attributes, and lists in attributes);
    the layer's own variables are copied. So a block whose sublayers are masked copies as well as a plain one
    (``strip_pruning`` of a pruned transformer), and sublayers that Keras cannot rebuild from their config
    (KerasHub's ``RMSNormalization``) are copied through the block that made them. A block whose sublayers
    are not all held in attributes is copied whole, weights in order, and converted in its copy.

    A block that Keras cannot rebuild from its config is not copied: its sublayers are converted *in place*, so
    the result and the original hold the same (converted) sublayers, and a :class:`prune.PruningWarning` says
    so. It is never shared unconverted and unannounced.
    """
    held = layer_attributes(layer) if layer.built else []
    # Unbuilt (its sublayers may not exist yet), or some sublayers are not in attributes: copy the whole layer,
    # every weight in order, and convert the copy.
    if not layer.built or len({id(v) for _, _, v in held}) != len({id(v) for v in sublayers(layer)}):
        copy = _clone_layer(layer)
        _replace_attributes(copy, in_place)
        return copy
    if shell is None or type(shell) is not type(layer):
        try:
            shell = type(layer).from_config(layer.get_config())
            if not shell.built:
                shell.build_from_config(layer.get_build_config())
        except Exception as exc:  # noqa: BLE001 - any failure to rebuild (KerasHub raises AttributeError too)
            return _in_place(layer, in_place, exc)
    targets = {(attr, index): v for attr, index, v in layer_attributes(shell)}
    missing = [attr if index is None else f"{attr}[{index}]" for attr, index, _ in held if (attr, index) not in targets]
    if missing:
        raise ValueError(
            f"cannot copy layer {layer.name!r} ({type(layer).__name__}): its copy from get_config has no sublayers "
            f"{missing}"
        )
    for attr, index, sub in held:
        counterpart = targets[(attr, index)]
        new = clone(sub, counterpart)
        if isinstance(new, PrunedBlock) and not isinstance(sub, PrunedBlock):
            new = new.layer  # the outermost block's PrunedBlock records every path; one wrapper is enough
        if new is not counterpart:
            replace_tracked_layer(shell, attr, counterpart, new, index)
    _copy_variables(own_variables(layer), own_variables(shell), layer.name, type(shell).__name__)
    return shell


def _in_place(layer: Any, in_place: Callable[[Any], Any], exc: Exception) -> Any:
    """``layer`` itself, its prunable sublayers converted in place, with a :class:`prune.PruningWarning`."""
    before = [id(x) for x in iter_layers(layer)]
    _replace_attributes(layer, in_place)
    changed = [id(x) for x in iter_layers(layer)] != before
    what = (
        "its prunable sublayers are pruned in place (the original model now holds the same masked layers), and it"
        if changed
        else "it has nothing to prune, and"
    )
    warnings.warn(
        f"layer {layer.name!r} ({type(layer).__name__}) cannot be copied through its config "
        f"({type(exc).__name__}: {str(exc).strip()[:200]}); it is used itself: {what} shares its variables with the "
        "result. Give the layer get_config/from_config (and register it with "
        "keras.saving.register_keras_serializable) to get a copy",
        PruningWarning,
        stacklevel=5,
    )
    return layer


def _copy_subclassed(model: Any, fn: Callable[[Any], Any]) -> Any:
    """A copy of a nested subclassed model (``from_config`` and weights), converted in place."""
    try:
        copy = type(model).from_config(model.get_config())
        if model.built:
            copy.build_from_config(model.get_build_config())
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot copy"; say which model and why
        raise ValueError(
            f"nested model {model.name!r} ({type(model).__name__}) cannot be copied: {exc}. Give it get_config/"
            "from_config, or prune its layers when you build it: prune.prune_low_magnitude(keras.layers.Dense(...))"
        ) from exc
    _copy_variables(model.weights, copy.weights, model.name, type(copy).__name__)
    _replace_attributes(copy, fn)
    return copy


def _replace_attributes(parent: Any, fn: Callable[[Any], Any]) -> None:
    """Convert ``parent``'s sublayers in place (a subclassed model, or a block): each layer held in an
    attribute, or in a list in one, is swapped for ``fn`` of it, keeping Keras's tracking in step."""
    for attr, index, value in layer_attributes(parent):
        new = fn(value)
        if new is value:
            if isinstance(value, keras.Model) or has_sublayers(value):
                _replace_attributes(value, fn)
            continue
        replace_tracked_layer(parent, attr, value, new, index)
    for attr, value in list(vars(parent).items()):
        if attr.startswith("_") or not isinstance(value, tuple):
            continue
        if any(isinstance(v, keras.layers.Layer) for v in value):
            raise ValueError(
                f"attribute {attr!r} of {type(parent).__name__} holds a tuple of layers, which cannot be changed in "
                "place; hold them in a list, or prune them when you build the model: "
                "prune.prune_low_magnitude(keras.layers.Dense(...))"
            )


# Layers without weights, from tfmot's PruneRegistry (those with an empty weight list) as Keras 3 names them.
_WEIGHTLESS: tuple[type, ...] = tuple(
    getattr(keras.layers, name)
    for name in (
        "InputLayer ELU LeakyReLU ReLU Softmax Activation ActivityRegularization Dropout AlphaDropout "
        "GaussianDropout GaussianNoise SpatialDropout1D SpatialDropout2D SpatialDropout3D Flatten Lambda Masking "
        "Permute RepeatVector Reshape Rescaling Cropping1D Cropping2D Cropping3D UpSampling1D UpSampling2D "
        "UpSampling3D ZeroPadding1D ZeroPadding2D ZeroPadding3D Add Average Concatenate Dot Maximum Minimum "
        "Multiply Subtract AveragePooling1D AveragePooling2D AveragePooling3D MaxPooling1D MaxPooling2D "
        "MaxPooling3D GlobalAveragePooling1D GlobalAveragePooling2D GlobalAveragePooling3D GlobalMaxPooling1D "
        "GlobalMaxPooling2D GlobalMaxPooling3D"
    ).split()
    if hasattr(keras.layers, name)
)


def _passes_through(layer: Any) -> bool:
    """Whether ``layer`` has nothing to prune: a weightless layer, or one tfmot also leaves dense."""
    if type(layer) in _WEIGHTLESS or keeps_dense(layer):
        return True
    if layer.built:
        return not any(len(w.shape) >= 2 for w in layer.trainable_weights)
    return False


def _prune_one(layer: Any, params: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    if isinstance(layer, keras.Model):
        raise ValueError(f"to_prune holds a model {layer.name!r} inside a list; pass models on their own")
    if is_masked_layer(layer):
        raise ValueError(f"to_prune {layer.name!r} is already pruned; strip_pruning it first")
    if masked_class_for(layer) is not None or is_custom_prunable(layer):
        return _to_masked(layer, params, kwargs)
    if _passes_through(layer):
        if not kwargs:
            return layer
        try:  # tfmot gives the kwargs (input_shape, name, ...) to its wrapper; here to a copy of the layer
            return _copy_built(layer, type(layer).from_config({**layer.get_config(), **kwargs}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"keyword arguments {sorted(kwargs)} do not fit {type(layer).__name__}: {exc}") from exc
    raise ValueError(
        f"to_prune is a {type(layer).__name__}, which is not prunable; register it with prune.register_prunable"
    )


def prune_low_magnitude(
    to_prune: Any,
    pruning_schedule: Any = None,
    block_size: tuple[int, int] = (1, 1),
    block_pooling_type: str = "AVG",
    pruning_policy: PruningPolicy | None = None,
    sparsity_m_by_n: tuple[int, int] | None = None,
    *,
    criterion: str = "magnitude",
    scope: str = "layer",
    seed: int = 0,
    pattern: Any = None,
    **kwargs: Any,
) -> Any:
    """Give every prunable layer a mask and a schedule.

    Args:
        to_prune: What to prune (as in tfmot, plus subclassed models):

            * a Keras layer: its masked twin, with ``**kwargs`` forwarded to
              it (``name=...``; an ``input_shape`` given to the layer is kept).
              A layer with nothing to prune (``Dropout``, ``Flatten``,
              ``BatchNormalization``, ``DepthwiseConv2D``, ...) is returned as
              it is;
            * a list of layers: a list, each layer pruned as above, except
              that already pruned layers and ``InputLayer`` pass through;
            * a Sequential or functional model: a clone in which every
              prunable layer is masked, nested Sequential and functional
              models too, recursively. Layers already pruned keep their own
              masks and schedule. The clone shares no layer and no variable
              with ``to_prune``;
            * a subclassed model: changed in place and returned (tfmot refuses
              these). Nested models in it are replaced by pruned copies.
        pruning_schedule: A :class:`prune.PruningSchedule`, a tfmot schedule, or
            any ``step -> (should_update, sparsity)`` callable. Defaults to
            tfmot's default, ``ConstantSparsity(0.5, begin_step=0)``.
        block_size: ``(r, c)``: ``(1, 1)`` is unstructured, anything else is
            ``Block(block_size, block_pooling_type)`` (2-D weights only).
        block_pooling_type: ``"AVG"`` or ``"MAX"``, how a block's scores pool.
        pruning_policy: A :class:`prune.PruningPolicy` that picks the layers
            to prune, e.g. :class:`prune.PruneForLatencyOnXNNPack`; Sequential
            and functional models only, as in tfmot.
        sparsity_m_by_n: ``(m, n)``: ``m`` zeros in every ``n`` consecutive
            weights along the input dimension, i.e. ``NByM(m, n)``.
        criterion: ``"magnitude"`` (default) or ``"random"``, or a registered name.
        scope: ``"layer"`` (default, a threshold per weight) or ``"global"``.
        seed: Seed for the random criterion.
        pattern: A :mod:`prune.core.patterns` value: ``prune.Unstructured()``
            (default), ``prune.Block((r, c), "AVG")``, ``prune.NByM(m, n)``,
            ``prune.Channel()``. Or, as in tfmot, ``block_size``,
            ``block_pooling_type`` and ``sparsity_m_by_n`` (give one or the other).
        **kwargs: Keyword arguments of the layer (``to_prune`` a single layer only).

    Returns:
        The pruned layer, list or model. Unsupported layers in a model stay
        dense (tfmot raises), named in a :class:`prune.PruningWarning`; see
        :func:`unsupported_layers` and :func:`prune.sparsity_report`. Train it with
        :class:`prune.UpdatePruningStep`: training without it raises.

    Raises:
        ValueError: bad schedule, criterion, scope, seed, policy or keyword
            argument, or an unprunable layer; before anything is built.
    """
    schedule = as_schedule(ConstantSparsity(0.5, 0) if pruning_schedule is None else pruning_schedule)
    get_criterion(criterion)
    get_distribution(scope)
    pattern = pattern_from_args(pattern, block_size, block_pooling_type, sparsity_m_by_n)
    check_pruning_args(pattern, criterion, scope, seed)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if pruning_policy is not None and not isinstance(pruning_policy, PruningPolicy):
        raise ValueError(f"pruning_policy must be a prune.PruningPolicy, got {pruning_policy!r}")
    params = {"pruning_schedule": schedule, "pattern": pattern, "criterion": criterion, "scope": scope, "seed": int(seed)}
    is_layer = isinstance(to_prune, keras.layers.Layer) and not isinstance(to_prune, keras.Model)
    if kwargs and not is_layer:
        raise ValueError(
            f"keyword arguments {sorted(kwargs)} are forwarded to a single layer only; to_prune is a "
            f"{type(to_prune).__name__}. Set them on the layers before pruning"
        )
    if pruning_policy is not None and not (isinstance(to_prune, keras.Model) and _is_graph_model(to_prune)):
        raise ValueError(
            f"pruning_policy applies to Sequential and functional models only, got to_prune of type "
            f"{type(to_prune).__name__}; prune the layers you choose directly instead"
        )
    if isinstance(to_prune, (list, tuple)):
        bad = [type(x).__name__ for x in to_prune if not isinstance(x, keras.layers.Layer)]
        if bad:
            raise ValueError(f"to_prune must be a list of Keras 3 layers, got items of type {bad}")
    if pruning_schedule is not None:
        _warn_kept_schedules(to_prune, schedule)
    if isinstance(to_prune, (list, tuple)):
        out = []
        for layer in to_prune:
            if is_masked_layer(layer):
                out.append(layer)
            elif isinstance(layer, keras.layers.InputLayer):
                out.append(type(layer).from_config(layer.get_config()))
            else:
                out.append(_prune_one(layer, params, {}))
        return out
    if not isinstance(to_prune, keras.layers.Layer):
        raise ValueError(
            "to_prune must be a Keras 3 layer, a list of layers or a model, got "
            f"{type(to_prune).__module__}.{type(to_prune).__name__}"
        )
    if is_layer:
        return _prune_one(to_prune, params, kwargs)
    if pruning_policy is not None:
        pruning_policy.ensure_model_supports_pruning(to_prune)

    def fn(layer: Any) -> Any:
        if is_masked_layer(layer):
            return layer  # already pruned: kept (and copied) with its own masks and schedule
        if pruning_policy is not None and not pruning_policy.allow_pruning(layer):
            return layer
        return _to_masked(layer, params)

    pruned = _convert(to_prune, fn)
    _warn_unsupported(pruned)
    return pruned


def _warn_unsupported(model: Any) -> None:
    """Warn, naming them, about the layers with weights that stay dense (tfmot raises for them)."""
    names = unsupported_layers(model)
    if names:
        warnings.warn(
            f"{len(names)} layer(s) with weights stay dense, as no masked class is registered for them: {names}. "
            "The model ends less sparse than its target; prune.sparsity_report(model) shows by how much. Register "
            "a masked class with prune.register_prunable, or give the layer get_prunable_weights()",
            PruningWarning,
            stacklevel=3,
        )


def _warn_kept_schedules(to_prune: Any, schedule: Any) -> None:
    """Warn that layers already pruned with another schedule keep theirs (tfmot keeps them silently).

    Not an error: tfmot's ``prune_low_magnitude`` passes already wrapped layers
    through, and wrapping some layers first with their own schedule, then the
    whole model, is how a tfmot model gives layers different schedules.
    """
    if isinstance(to_prune, keras.layers.Layer) and not isinstance(to_prune, keras.Model):
        return  # one layer: an already pruned one is refused by _prune_one
    items = to_prune if isinstance(to_prune, (list, tuple)) else [to_prune]
    kept = [
        f"{layer.name!r} ({layer.pruning_schedule!r})"
        for item in items
        if isinstance(item, keras.layers.Layer)
        for layer in prunable_layers(item)
        if layer.pruning_schedule != schedule
    ]
    if kept:
        warnings.warn(
            f"pruning_schedule={schedule!r} is not applied to layers already pruned, which keep their own schedule: "
            f"{', '.join(kept)}. To re-prune them with it, prune.strip_pruning the model first",
            UserWarning,
            stacklevel=3,
        )


def strip_pruning(model: Any) -> Any:
    """Replace masked layers by the plain Keras layers, with the zeros in place.

    ``SparseDense`` layers become plain ``Dense`` layers holding their zeros
    (:meth:`prune.layers.SparseDense.to_dense_layer`; ``SparseConv2D``,
    ``SparseEinsumDense`` and ``SparseMultiHeadAttention`` become ``Conv2D``,
    ``EinsumDense`` and ``MultiHeadAttention``). The result has no
    masks, counters or ``prune`` classes, loads without custom objects and
    converts to TFLite (:func:`prune.deploy.export.to_tflite`).

    Raises:
        ValueError: a ``SparseDense`` layer is not built.
    """
    return _convert(model, _to_plain)


def is_pruned(model: Any) -> bool:
    """Whether ``model`` (or layer) contains any masked layer."""
    return bool(prunable_layers(model))


def unsupported_layers(model: Any) -> list[str]:
    """Names of the layers with matrix-like weights that stay dense: no masked class is registered."""
    return [layer.name for layer, _ in unsupported(model)]
