"""``shrink``: physically remove pruned output units, giving a smaller plain Keras model.

After channel pruning (``pattern=prune.Channel()``) whole output units of
Dense and Conv layers are zero. :func:`shrink` removes them, together with the
matching input rows of the next weight layer, and returns a plain
``keras.Sequential`` computing the same function.

A removed unit is not silent: its kernel column is zero but its bias is not,
so it outputs the constant ``activation(bias)``. That constant flows through
the channel-wise layers between (activations, pooling, dropout, flatten) and
into the next weight layer, whose bias absorbs it: ``b' = b + sum_j c_j *
sum(K[..., j, :])``. This is exact for a Dense consumer and for a Conv
consumer with ``padding="valid"``; with ``"same"`` padding the border sees
zeros instead of the constant, so a nonzero constant there is an error.

A unit counts as pruned when its whole kernel column (``kernel[..., j]``) is
exactly zero, whatever made it so; the last weight layer keeps its outputs
(the model's output shape does not change). Supported: built
``keras.Sequential`` models of Dense, Conv1D and Conv2D (masked or plain,
``channels_last``) with Activation, ReLU, LeakyReLU, ELU, pooling, global
pooling, Dropout and Flatten layers between them.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pandas as pd

__all__ = ["shrink", "shrink_report"]

_WEIGHT = ("Dense", "Conv1D", "Conv2D")
_CHANNELWISE = (
    "Activation",
    "ReLU",
    "LeakyReLU",
    "ELU",
    "MaxPooling1D",
    "MaxPooling2D",
    "AveragePooling1D",
    "AveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
)


def _kind(layer: Any) -> str | None:
    names = [c.__name__ for c in type(layer).__mro__]
    for name in names:
        if name in _WEIGHT or name in _CHANNELWISE or name == "Flatten":
            return name
    return None


def _kernel(layer: Any) -> np.ndarray:
    from prune.layers.masked import is_masked_layer

    if is_masked_layer(layer):
        weight, mask = layer.weight_and_mask("kernel")
        return np.where(mask.numpy() != 0, weight.numpy(), 0.0).astype(weight.dtype)
    return np.asarray(layer.kernel.numpy())


def _plan(model: Any) -> list[dict[str, Any]]:
    if not isinstance(model, keras.Sequential) or not model.built:
        raise ValueError(f"model must be a built keras.Sequential, got {type(model).__name__} (built={getattr(model, 'built', None)})")
    layers = list(model.layers)
    kinds = [_kind(layer) for layer in layers]
    for layer, kind in zip(layers, kinds):
        if kind is None:
            raise ValueError(
                f"shrink cannot pass layer {layer.name!r} ({type(layer).__name__}); supported: "
                f"{list(_WEIGHT) + list(_CHANNELWISE) + ['Flatten']}"
            )
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise ValueError(f"shrink needs channels_last; layer {layer.name!r} has data_format={layer.data_format!r}")
    weight_idx = [i for i, k in enumerate(kinds) if k in _WEIGHT]
    if not weight_idx:
        raise ValueError(f"model {model.name!r} has no Dense or Conv layer to shrink")
    last = weight_idx[-1]
    plan = []
    build = layers[0].get_build_config() or {}
    if "input_shape" not in build:
        raise ValueError(f"the first layer of model {model.name!r} has no input shape")
    shape = tuple(build["input_shape"])
    in_keep = np.ones(int(shape[-1]), bool)
    const = np.zeros(in_keep.size)  # value of each removed channel (0 where kept)
    for i, (layer, kind) in enumerate(zip(layers, kinds)):
        step: dict[str, Any] = {"layer": layer, "kind": kind, "in_keep": in_keep, "input_shape": shape}
        if kind in _WEIGHT:
            kernel = _kernel(layer)
            bias = np.asarray(layer.bias.numpy(), np.float64) if layer.use_bias else np.zeros(kernel.shape[-1])
            removed = ~in_keep
            if removed.any() and np.any(const[removed] != 0):
                if kind != "Dense" and layer.padding != "valid":
                    raise ValueError(
                        f"layer {layer.name!r} has padding={layer.padding!r}; a removed input channel with a nonzero "
                        "constant output cannot be folded into its bias (use padding='valid' or a zero bias)"
                    )
                spatial = tuple(range(kernel.ndim - 2))
                k_in = kernel.sum(axis=spatial) if spatial else kernel  # [in, out]
                bias = bias + const[removed] @ k_in[removed].astype(np.float64)
            live = np.any(kernel.reshape(-1, kernel.shape[-1]) != 0, axis=0)
            out_keep = np.ones_like(live) if i == last else live
            if not out_keep.any():
                raise ValueError(f"every output unit of layer {layer.name!r} is pruned; shrink would leave it empty")
            pre = np.where(out_keep, 0.0, bias)  # removed units: kernel column is zero, output is activation(bias)
            act = keras.activations.get(layer.activation) if layer.activation is not None else None
            out_const = np.asarray(act(pre.astype("float32")[None])).reshape(-1) if act is not None else pre
            step.update(kernel=kernel, bias=bias, out_keep=out_keep)
            plan.append(step)
            in_keep, const = out_keep, np.where(out_keep, 0.0, out_const)
        elif kind == "Flatten":
            spatial = int(np.prod(shape[1:-1])) if len(shape) > 2 else 1
            plan.append(step)
            in_keep, const = np.tile(in_keep, spatial), np.tile(const, spatial)
        else:
            # A channel-wise layer maps a constant channel to a constant: apply it to one.
            x = np.broadcast_to(const.astype("float32"), (1,) + tuple(int(d) for d in shape[1:]))
            y = np.asarray(layer(x, training=False)).reshape(-1, const.size)[0]
            plan.append(step)
            const = np.where(in_keep, 0.0, y)
        shape = tuple(layer.compute_output_shape(shape))
    return plan


def shrink_report(model: Any) -> pd.DataFrame:
    """One row per Dense/Conv layer: units before and after, inputs kept, parameters of the shrunk layer.

    Columns: ``layer``, ``units``, ``live_units``, ``inputs``, ``live_inputs``,
    ``params`` (kernel and bias of the shrunk layer). ``shrink(model).count_params()``
    equals ``params.sum()`` (the other supported layers have no parameters).
    """
    rows = []
    for step in _plan(model):
        if step["kind"] not in _WEIGHT:
            continue
        kernel, in_keep, out_keep = step["kernel"], step["in_keep"], step["out_keep"]
        window = int(np.prod(kernel.shape[:-2], dtype=np.int64))
        n_in, n_out = int(in_keep.sum()), int(out_keep.sum())
        rows.append(
            dict(
                layer=step["layer"].name,
                units=int(out_keep.size),
                live_units=n_out,
                inputs=int(in_keep.size),
                live_inputs=n_in,
                params=window * n_in * n_out + (n_out if step["layer"].use_bias else 0),
            )
        )
    return pd.DataFrame(rows, columns=["layer", "units", "live_units", "inputs", "live_inputs", "params"])


def shrink(model: Any) -> keras.Sequential:
    """A smaller plain ``keras.Sequential`` without the pruned output units, computing the same function.

    Args:
        model: A built ``keras.Sequential`` (masked, e.g. channel-pruned, or plain).

    Returns:
        A new model of plain Keras layers (no ``prune`` classes), sharing no
        variables with ``model``. Outputs agree with ``model`` up to float
        rounding (the folded biases are summed in float64, then cast).

    Raises:
        ValueError: an unsupported model or layer, naming it; nothing is changed.
    """
    plan = _plan(model)
    new_layers = []
    for step in plan:
        layer, kind = step["layer"], step["kind"]
        config = layer.get_config()
        if kind in _WEIGHT:
            from prune.layers.masked import is_masked_layer

            base = layer.base_class if is_masked_layer(layer) else type(layer)
            if is_masked_layer(layer):
                config = layer.plain_config(config)
            config["units" if kind == "Dense" else "filters"] = int(step["out_keep"].sum())
            new = base.from_config(config)
            kernel = step["kernel"][..., step["in_keep"], :][..., step["out_keep"]]
            values = [kernel]
            if layer.use_bias:
                values.append(step["bias"][step["out_keep"]].astype(kernel.dtype))
            new_layers.append((new, values))
        else:
            new_layers.append((type(layer).from_config(config), None))
    out = keras.Sequential([keras.Input(tuple(plan[0]["input_shape"][1:]))], name=f"{model.name}_shrunk")
    for new, values in new_layers:
        out.add(new)
        if values is not None:
            new.set_weights(values)
    return out
