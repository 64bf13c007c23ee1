"""``PrunedBlock``: a layer whose sublayers ``prune`` replaced, in a form that saves and loads.

A block such as KerasHub's ``TransformerDecoder`` builds its sublayers itself, in ``build``, and its config
does not describe them: rebuilt from its config (as ``keras.models.load_model`` rebuilds it), it holds plain
``Dense`` and ``EinsumDense`` layers again, and the saved masks cannot load into them. A pruned model therefore
holds such a block inside a ``PrunedBlock``, which records, beside the block's own config, the config of every
sublayer ``prune`` put in it (by attribute path, ``_self_attention_layer._query_dense``, ``encoder_layers.0._mlp_dense_1`` for a list item), and puts them back
when it is rebuilt. It calls the block with whatever it is called with, and has the block's name, so
``model.get_layer(name)`` finds it (its ``.layer`` is the block). :func:`prune.strip_pruning` unwraps it.
"""

from __future__ import annotations

from typing import Any, Iterator

import keras

from prune._internals import layer_attributes, replace_tracked_layer, sublayers
from prune.layers.kinds import LAYER_KINDS, register_layer

__all__ = ["PrunedBlock", "replaced_sublayers", "is_prune_layer"]


def is_prune_layer(layer: Any) -> bool:
    """Whether ``layer`` is of one of prune's layer kinds (a masked twin, ``SparseDense``, ...)."""
    return LAYER_KINDS.get(type(layer).__name__) is type(layer)


def replaced_sublayers(block: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, layer)`` for each of prune's layers that ``block`` holds in attributes, at any depth (not inside
    another of prune's layers)."""
    for attr, index, value in layer_attributes(block):
        path = f"{prefix}{attr}" if index is None else f"{prefix}{attr}.{index}"
        if is_prune_layer(value):
            yield path, value
        elif sublayers(value):
            yield from replaced_sublayers(value, prefix=f"{path}.")


def _locate(block: Any, path: str) -> tuple[Any, str, int | None]:
    """``(parent, attribute, index)`` of the sublayer at ``path`` (``encoder_layers.0._mlp``: a list item)."""
    parts = path.split(".")
    parent = block
    i = 0
    while True:
        attr = parts[i]
        index = int(parts[i + 1]) if i + 1 < len(parts) and parts[i + 1].isdigit() else None
        i += 1 if index is None else 2
        if i >= len(parts):
            return parent, attr, index
        parent = getattr(parent, attr) if index is None else getattr(parent, attr)[index]


@register_layer
class PrunedBlock(keras.layers.Wrapper):
    """A block (a layer with sublayers) in which ``prune`` replaced sublayers, saved with them.

    Args:
        layer: The block, already holding its replaced sublayers (built).
        replaced: Only from :meth:`from_config`: the serialised replaced sublayers by attribute path.
        **kwargs: Keras layer arguments; the name defaults to the block's.
    """

    def __init__(self, layer: Any, replaced: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("name", layer.name)
        super().__init__(layer, **kwargs)
        for path, config in (replaced or {}).items():
            parent, attr, index = _locate(layer, path)
            old = getattr(parent, attr) if index is None else getattr(parent, attr)[index]
            replace_tracked_layer(parent, attr, old, keras.saving.deserialize_keras_object(config), index)
        if layer.built:
            self.built = True

    def build(self, input_shape: Any = None) -> None:
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer(*args, **kwargs)

    def compute_output_shape(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer.compute_output_shape(*args, **kwargs)

    def compute_output_spec(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer.compute_output_spec(*args, **kwargs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["replaced"] = {
            path: keras.saving.serialize_keras_object(layer) for path, layer in replaced_sublayers(self.layer)
        }
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "PrunedBlock":
        config = dict(config)
        layer = keras.saving.deserialize_keras_object(config.pop("layer"), custom_objects=custom_objects)
        return cls(layer, **config)
