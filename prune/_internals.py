"""Every private Keras attribute prune touches, behind one door.

Keras 3 offers no public way to do a few things prune needs: find which slot
variables of an optimizer shadow a model variable, give a variable a new
first dimension (a ``SparseDense`` layer shrinking its values), swap a layer
tracked by a subclassed model, and update Adam's moments row by row
(``LazyAdam``); nor TensorFlow one to tell that a graph is traced for XLA. Each such access is one function here, and
``tests/test_internals.py`` has one canary test per function that fails with
:class:`KerasInternalsChanged` (naming the attribute and the Keras version)
when Keras renames or removes it. ``setup.cfg`` pins the Keras line these
were written and tested against (:data:`TESTED_KERAS`).

Nothing else in ``prune`` reads or writes a private Keras or TensorFlow
attribute.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import keras

__all__ = [
    "TESTED_KERAS",
    "KerasInternalsChanged",
    "OPTIMIZER_VARIABLES",
    "optimizer_variables",
    "optimizer_variable_index",
    "adam_moments",
    "uses_weight_decay",
    "backing_variable",
    "set_backing_variable",
    "set_variable_shape",
    "layer_tracker",
    "layer_attributes",
    "replace_tracked_layer",
    "has_sublayers",
    "in_xla_context",
    "input_shape_arg",
    "sublayers",
    "own_variables",
    "override_call",
    "keras_producer",
    "inbound_nodes",
    "outbound_nodes",
    "private_weight",
]

TESTED_KERAS = "3.15"
"""The Keras minor version these accesses were written against (pinned in setup.cfg)."""

OPTIMIZER_VARIABLES = "_trainable_variables"
"""Name of the optimizer attribute listing the variables it trains, in slot order."""


class KerasInternalsChanged(RuntimeError):
    """A private Keras attribute prune relies on is gone or changed."""


def _missing(owner: Any, name: str, what: str) -> KerasInternalsChanged:
    return KerasInternalsChanged(
        f"{type(owner).__name__}.{name} ({what}) is missing in Keras {keras.__version__}; prune was tested with "
        f"Keras {TESTED_KERAS}.x (see prune/_internals.py and setup.cfg)"
    )


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The variables a built Keras 3 optimizer trains, in the order of its slot lists (``_momentums[i]``...)."""
    try:
        return list(getattr(optimizer, OPTIMIZER_VARIABLES))
    except AttributeError:
        raise _missing(optimizer, OPTIMIZER_VARIABLES, "the variables it trains") from None


def optimizer_variable_index(optimizer: Any, variable: Any) -> Any:
    """The slot index of ``variable`` (works inside ``tf.function``; the optimizer's own lookup)."""
    try:
        lookup = optimizer._get_variable_index
    except AttributeError:
        raise _missing(optimizer, "_get_variable_index", "slot index of a variable") from None
    return lookup(variable)


def adam_moments(optimizer: Any, index: int) -> tuple[Any, Any, Any | None]:
    """``(m, v, v_hat or None)`` slot variables of Adam at ``index``."""
    try:
        m, v = optimizer._momentums[index], optimizer._velocities[index]
    except AttributeError:
        raise _missing(optimizer, "_momentums/_velocities", "Adam's moment slots") from None
    hat = None
    if optimizer.amsgrad:
        try:
            hat = optimizer._velocity_hats[index]
        except AttributeError:
            raise _missing(optimizer, "_velocity_hats", "AMSGrad's slot") from None
    return m, v, hat


def uses_weight_decay(optimizer: Any, variable: Any) -> bool:
    """Whether the optimizer's weight decay applies to ``variable`` (its exclusion lists)."""
    try:
        check = optimizer._use_weight_decay
    except AttributeError:
        raise _missing(optimizer, "_use_weight_decay", "weight-decay exclusion check") from None
    return bool(check(variable))


def backing_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 (TensorFlow backend) variable."""
    try:
        return variable._value
    except AttributeError:
        raise _missing(variable, "_value", "the backing tf.Variable") from None


def set_backing_variable(variable: Any, backing: Any) -> None:
    """Replace the ``tf.Variable`` behind a Keras variable (to change its shape)."""
    if not hasattr(variable, "_value"):
        raise _missing(variable, "_value", "the backing tf.Variable")
    variable._value = backing


def set_variable_shape(variable: Any, shape: tuple[int, ...]) -> None:
    """Set the shape a Keras variable reports, after its backing variable changed length."""
    if not hasattr(variable, "_shape"):
        raise _missing(variable, "_shape", "the shape Keras reports")
    variable._shape = tuple(shape)


def layer_tracker(layer: Any) -> Any | None:
    """The layer's attribute tracker (``replace_tracked_value``, ``lock``/``unlock``), or ``None`` for a
    layer that never tracked anything."""
    return getattr(layer, "_tracker", None)


def layer_attributes(parent: Any) -> list[tuple[str, int | None, Any]]:
    """``(attribute, index, layer)`` for each layer ``parent`` holds in an attribute of its own, or in a list in
    one (``index`` its position, else ``None``): public attributes, and private ones that ``parent`` tracks as
    sublayers (KerasHub's ``self._feedforward_intermediate_dense``, Keras's ``MultiHeadAttention._query_dense``);
    never Keras's own bookkeeping (``_layers``)."""
    tracked = {id(v) for v in sublayers(parent)}
    out: list[tuple[str, int | None, Any]] = []
    for attr, value in list(vars(parent).items()):
        if isinstance(value, keras.layers.Layer):
            if not attr.startswith("_") or id(value) in tracked:
                out.append((attr, None, value))
        elif isinstance(value, list) and attr not in ("_layers", "layers"):
            items = [(i, v) for i, v in enumerate(value) if isinstance(v, keras.layers.Layer)]
            if items and (not attr.startswith("_") or all(id(v) in tracked for _, v in items)):
                out.extend((attr, i, v) for i, v in items)
    return out


def replace_tracked_layer(parent: Any, attr: str, old: Any, new: Any, index: int | None = None) -> None:
    """Put ``new`` in ``parent.<attr>`` (or ``parent.<attr>[index]``) in place of the sublayer ``old``, keeping
    Keras's tracking in step.

    Keras locks a built layer's state; ``replace_tracked_value`` is its own way of swapping one tracked layer
    for another (in ``_layers``, at the same position). A tracked list's ``__setitem__`` tracks nothing, so the
    item is set after the swap.
    """
    tracker = layer_tracker(parent)
    if tracker is None:
        if index is None:
            setattr(parent, attr, new)
        else:
            getattr(parent, attr)[index] = new
        return
    try:
        locked = tracker.locked
        unlock, lock, replace = tracker.unlock, tracker.lock, tracker.replace_tracked_value
    except AttributeError:
        raise _missing(parent, "_tracker.replace_tracked_value", "swapping a tracked sublayer") from None
    unlock()
    try:
        replace("layers", old, new)
        if index is None:
            object.__setattr__(parent, attr, new)
        else:
            list.__setitem__(getattr(parent, attr), index, new)
    finally:
        if locked:
            lock()


def has_sublayers(layer: Any) -> bool:
    """Whether a (non-Model) layer tracks sublayers of its own."""
    return bool(sublayers(layer))


def sublayers(layer: Any) -> list[Any]:
    """The layers ``layer`` tracks directly (a model's layers, a custom block's or an RNN's cell), in order.

    Keras 3 keeps them in ``_layers`` (``Model.layers`` drops an ``InputLayer``
    and hides nothing else; a plain ``Layer`` has no public list); an object
    without it (a Keras op of a functional model) has none.
    """
    children = getattr(layer, "_layers", None)
    if children is None:
        children = getattr(layer, "layers", [])
    return list(children)


def own_variables(layer: Any) -> list[Any]:
    """The layer's own variables in the order ``save_own_variables`` writes them (trainable, then not)."""
    try:
        return list(layer._trainable_variables) + list(layer._non_trainable_variables)
    except AttributeError:
        raise _missing(layer, "_trainable_variables/_non_trainable_variables", "the layer's own variables") from None


@contextlib.contextmanager
def override_call(layer: Any, call: Any) -> Iterator[None]:
    """Run ``layer`` through ``call`` instead of its own ``call`` inside the block (one gradient pass).

    Keras's ``Layer.__call__`` looks ``self.call`` up on the instance, so an
    instance attribute takes precedence; it is removed on leaving. Keras does
    not promise that lookup (a compiled ``call`` cached per instance would
    bypass it), hence the canary test.
    """
    object.__setattr__(layer, "call", call)
    try:
        yield
    finally:
        layer.__dict__.pop("call", None)


def keras_producer(tensor: Any) -> Any:
    """The operation (layer) that produced a symbolic Keras tensor."""
    try:
        return tensor._keras_history.operation
    except AttributeError:
        raise _missing(tensor, "_keras_history", "the operation that produced a symbolic tensor") from None


def inbound_nodes(layer: Any) -> list[Any]:
    """The nodes of the calls of ``layer`` (each with ``input_tensors``)."""
    try:
        return list(layer._inbound_nodes)
    except AttributeError:
        raise _missing(layer, "_inbound_nodes", "the nodes of its calls") from None


def outbound_nodes(layer: Any) -> list[Any]:
    """The nodes of the calls that consume ``layer``'s outputs (each with ``operation``)."""
    try:
        return list(layer._outbound_nodes)
    except AttributeError:
        raise _missing(layer, "_outbound_nodes", "the nodes consuming its outputs") from None


def private_weight(layer: Any, name: str) -> Any | None:
    """The variable a layer keeps under ``_<name>`` (Dense's ``_kernel``, Embedding's ``_embeddings``), or ``None``.

    Keras 3 stores some weights behind a property of the public name (which may
    return a dequantised or LoRA-merged tensor, not the variable).
    """
    private = getattr(layer, f"_{name}", None)
    return private if isinstance(private, keras.Variable) else None


def in_xla_context() -> bool:
    """Whether the graph being traced will be compiled by XLA (``tf.function(jit_compile=True)``, which is how
    Keras's ``compile(jit_compile=True)`` builds its steps). TensorFlow's only test for it is private."""
    import tensorflow as tf

    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        raise KerasInternalsChanged(
            f"tensorflow.python.ops.control_flow_util is missing in TensorFlow {tf.__version__} (XLA context test)"
        ) from None
    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def input_shape_arg(layer: Any) -> Any:
    """The ``input_shape`` a layer was constructed with (Keras 3 keeps it out of ``get_config``), or ``None``."""
    return getattr(layer, "_input_shape_arg", None)
