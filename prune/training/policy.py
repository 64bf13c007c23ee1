"""Pruning policies: which layers of a model ``prune_low_magnitude`` prunes.

tfmot's ``tfmot.sparsity.keras.PruningPolicy`` and ``PruneForLatencyOnXNNPack``
(``pruning_policy.py`` in tensorflow/model-optimization), ported to Keras 3's
graph of operations. As in tfmot, a policy applies to Sequential and
functional models: :func:`prune.prune_low_magnitude` first calls
``ensure_model_supports_pruning(model)`` (which raises for a model the policy
cannot serve) and then prunes only the layers for which
``allow_pruning(layer)`` is true; every other layer is copied as it is.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable

import keras

from prune._internals import inbound_nodes, keras_producer, outbound_nodes

__all__ = ["PruningPolicy", "PruneForLatencyOnXNNPack", "KeepDense"]


class PruningPolicy(abc.ABC):
    """Decides which layers of a model are pruned. Subclass it for your own policy.

    Example::

        model = prune.prune_low_magnitude(model, schedule, pruning_policy=prune.PruneForLatencyOnXNNPack())
    """

    @abc.abstractmethod
    def allow_pruning(self, layer: Any) -> bool:
        """Whether ``layer`` gets a mask."""

    @abc.abstractmethod
    def ensure_model_supports_pruning(self, model: Any) -> None:
        """Raise ``ValueError`` if ``model`` cannot be pruned under this policy."""


def _layer_of(tensor: Any) -> Any:
    return keras_producer(tensor)


def _members(model: Any) -> set[int]:
    """Ids of the operations of ``model`` and of the models nested in it.

    Keras 3 records every call of a layer in its nodes, whichever model it was
    called for; the walk below must stay inside this model.
    """
    out: set[int] = set()
    for op in getattr(model, "operations", None) or model.layers:
        out.add(id(op))
        if isinstance(op, keras.Model):
            out |= _members(op)
    return out


def _producers(layer: Any, members: set[int]) -> set[Any]:
    found = {_layer_of(t) for node in inbound_nodes(layer) for t in node.input_tensors}
    return {p for p in found if id(p) in members}


def _consumers(layer: Any, members: set[int]) -> list[Any]:
    def unpack(consumer: Any) -> Any:  # a nested Sequential is looked at through its first layer
        return unpack(consumer.layers[0]) if isinstance(consumer, keras.Sequential) else consumer

    return [unpack(node.operation) for node in outbound_nodes(layer) if id(node.operation) in members]


def _lookup(sources: Iterable[Any], stop: Callable[[Any], bool], step: Callable[[Any], Iterable[Any]]) -> set[Any]:
    """tfmot's ``_lookup_layers``: walk from ``sources`` until ``stop``; empty if a branch ends first."""
    to_visit, used, found = set(sources), set(sources), set()
    while to_visit:
        layer = to_visit.pop()
        if stop(layer):
            found.add(layer)
            continue
        following = list(step(layer))
        if not following:
            return set()
        for nxt in following:
            if nxt not in used:
                used.add(nxt)
                to_visit.add(nxt)
    return found


def _same(value: Any, expected: tuple) -> bool:
    return tuple(value) == expected


class PruneForLatencyOnXNNPack(PruningPolicy):
    """Prune only the 1x1 ``Conv2D`` layers of a model that XNNPACK can run sparse.

    As in tfmot: the model must start (in every input branch) with a 3x3,
    stride-2, ``valid`` ``Conv2D`` on 3 input channels after a
    ``ZeroPadding2D(1)``, end (in every output branch) with a
    ``GlobalAveragePooling2D``, and hold between them only layers XNNPACK's
    sparse inference supports. Only the 1x1 ``Conv2D`` layers are pruned.

    References:
        Elsen et al., "Fast Sparse ConvNets", CVPR 2020 (arXiv:1911.09723);
        XNNPACK sparse inference, tensorflow/lite/delegates/xnnpack/README.md.
    """

    _scope: set[int] = set()  # ids of the operations of the model being checked

    def allow_pruning(self, layer: Any) -> bool:
        """Only ``Conv2D`` layers with a 1x1 kernel."""
        return isinstance(layer, keras.layers.Conv2D) and _same(layer.kernel_size, (1, 1))

    def _is_start(self, layer: Any) -> bool:
        if not isinstance(layer, keras.layers.Conv2D):
            return False
        producers = list(_producers(layer, self._scope))
        return (
            layer.built
            and tuple(layer.kernel.shape[:3]) == (3, 3, 3)
            and _same(layer.strides, (2, 2))
            and layer.padding.lower() == "valid"
            and len(producers) == 1
            and isinstance(producers[0], keras.layers.ZeroPadding2D)
            and _same(producers[0].padding, ((1, 1), (1, 1)))
        )

    @staticmethod
    def _is_end(layer: Any) -> bool:
        return isinstance(layer, keras.layers.GlobalAveragePooling2D)

    def _supported(self, layer: Any) -> bool:
        """tfmot's ``_check_layer_support``, itself a copy of XNNPACK's compatibility checks."""
        L = keras.layers
        if isinstance(layer, (L.Add, L.Multiply, L.ZeroPadding2D, L.ReLU, L.LeakyReLU, L.ELU, L.Dropout, L.Identity)):
            return True
        if not isinstance(layer, L.Layer):  # a Keras op in a functional model: tfmot's TFOpLambda add/subtract/...
            return type(layer).__name__ in ("Add", "Subtract", "Multiply", "Identity")
        if isinstance(layer, L.DepthwiseConv2D):
            padding = layer.padding.lower()
            producers = list(_producers(layer, self._scope))
            zero = producers[0] if len(producers) == 1 and isinstance(producers[0], L.ZeroPadding2D) else None
            k, s = tuple(layer.kernel_size), tuple(layer.strides)
            cases = (
                k == (3, 3) and s == (1, 1) and padding == "same",
                k == (3, 3) and s in ((1, 1), (2, 2)) and padding == "valid" and zero is not None
                and _same(zero.padding, ((1, 1), (1, 1))),
                k == (5, 5) and s == (1, 1) and padding == "same",
                k == (5, 5) and s in ((1, 1), (2, 2)) and padding == "valid" and zero is not None
                and _same(zero.padding, ((2, 2), (2, 2))),
            )
            return layer.depth_multiplier == 1 and _same(layer.dilation_rate, (1, 1)) and any(cases)
        if isinstance(layer, L.Conv2D):
            return (
                layer.groups == 1
                and _same(layer.dilation_rate, (1, 1))
                and _same(layer.kernel_size, (1, 1))
                and _same(layer.strides, (1, 1))
            )
        if isinstance(layer, L.GlobalAveragePooling2D):
            return bool(layer.keepdims)
        if isinstance(layer, L.BatchNormalization):
            axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
            return [a % 4 for a in axis] == [3]
        if isinstance(layer, L.UpSampling2D):
            return layer.interpolation == "bilinear"
        if isinstance(layer, L.Activation):
            name = getattr(layer.activation, "__name__", "")
            return name in ("relu", "relu6", "leaky_relu", "elu", "sigmoid")
        return False  # masked layers subclass their plain layer, so MaskedConv2D was judged as Conv2D above

    def ensure_model_supports_pruning(self, model: Any) -> None:
        """Check the model as tfmot does.

        Raises:
            ValueError: ``model`` is subclassed or unbuilt, or lacks the start
                or end layer in some branch, or holds an unsupported layer
                between them (named in the message).
        """
        if not (isinstance(model, keras.Sequential) or any(c.__name__ == "Functional" for c in type(model).__mro__)):
            raise ValueError("Subclassed models are not supported currently.")
        if not model.built:
            raise ValueError("Unbuilt models are not supported currently.")
        self._scope = scope = _members(model)
        consumers = lambda layer: _consumers(layer, scope)  # noqa: E731
        inputs = {_layer_of(t) for t in model.inputs}
        starts = _lookup(inputs, self._is_start, consumers)
        if not starts:
            raise ValueError(
                "Could not find `Conv2D 3x3` layer with stride 2x2, `input filters == 3` and `VALID` padding and "
                "preceding `ZeroPadding2D` with `padding == 1` in all input branches of the model"
            )
        outputs = {_layer_of(t) for t in model.outputs}
        ends = _lookup(outputs, self._is_end, lambda layer: _producers(layer, scope))
        if not ends:
            raise ValueError("Could not find a `GlobalAveragePooling2D` layer in all output branches")

        def visit(layer: Any) -> bool:
            if layer not in ends and not self._supported(layer):
                raise ValueError(
                    f"Layer {type(layer).__name__} is not supported for the {type(self).__name__} pruning policy"
                )
            return layer in ends

        _lookup([c for start in starts for c in consumers(start)], visit, consumers)


class KeepDense(PruningPolicy):
    """Prune every supported layer except the named ones, which stay dense.

    The usual first/last-layer policies of the literature: rigl's MNIST setup
    and its ERK default keep the output layer dense (Evci et al., ICML 2020),
    and Gale et al. (2019) keep the first layer dense for ResNet-50. For
    example, ``prune.prune_low_magnitude(model, schedule,
    pruning_policy=prune.KeepDense([model.layers[-1].name]))``.

    Args:
        names: Names of the layers to leave unpruned (non-empty strings).

    Raises:
        ValueError: ``names`` empty or not strings (here), or naming a layer the
            model does not have (in :meth:`ensure_model_supports_pruning`).
    """

    def __init__(self, names: Iterable[str]) -> None:
        names = [names] if isinstance(names, str) else list(names)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"names must be a non-empty list of layer names, got {names!r}")
        self.names = frozenset(names)

    def allow_pruning(self, layer: Any) -> bool:
        return layer.name not in self.names

    def ensure_model_supports_pruning(self, model: Any) -> None:
        from prune.core.targets import iter_layers

        present = {layer.name for layer in iter_layers(model) if layer is not model}  # nested layers too
        missing = sorted(self.names - present)
        if missing:
            raise ValueError(f"KeepDense names layers the model does not have: {missing} (it has {sorted(present)})")
