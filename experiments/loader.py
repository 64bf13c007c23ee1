"""Typed construction of frozen dataclass trees from plain data (TOML, JSON), and their canonical hash.

:func:`from_dict` builds a dataclass from a dict, checking keys (an unknown key
names the closest valid one, :mod:`difflib`), types (by the fields' type hints:
``int``, ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``, nested
dataclasses) and whatever the dataclass's ``__post_init__`` refuses; every
error is a :class:`~experiments.axis_registry.ConfigError` naming the field by its
dotted path (``training.learning_rate``, ``methods[2].rate``). A
``__post_init__`` may raise any ``ValueError`` with ``path`` and ``message``
attributes (the library's :class:`prune.training.imp.ParamError` does), and it is
reported at its field's path.

Two hooks a dataclass may define:

* ``SHORTHAND: ClassVar[str]``: the field a bare string stands for
  (``"lenet300"`` is ``{name = "lenet300"}``);
* ``from_plain(cls, data, path)`` / ``to_plain(self, drop_defaults)``: its own
  plain form (a method is a flat table of its name and its parameters).

:func:`config_hash` is the SHA-256 of :func:`canonical_json`, which leaves out
every field at its default (open_lth's ``hashname``), so adding a defaulted
field later keeps every existing hash. Nothing here knows the experiment schema
(:mod:`experiments.config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Union

from experiments.axis_registry import ConfigError

__all__ = ["convert", "from_dict", "to_dict", "canonical_json", "config_hash", "load_toml"]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def convert(tp: Any, value: Any, path: str) -> Any:
    """``value`` as type ``tp`` (a field's type hint), or :class:`ConfigError` at ``path``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return convert(inner, value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"must be a list, got {type(value).__name__} {value!r}")
        (inner, _ellipsis) = typing.get_args(tp)
        return tuple(convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if hasattr(tp, "from_plain"):
            return tp.from_plain(value, path)
        shorthand = getattr(tp, "SHORTHAND", None)
        if isinstance(value, str) and shorthand is not None:
            value = {shorthand: value}
        return from_dict(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")  # a bug in a schema, not user input


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, checking keys, types and ranges.

    Args:
        cls: A frozen dataclass (e.g. of :mod:`experiments.config`).
        data: A dict (as parsed from TOML or JSON).
        path: Dotted path of ``data`` for error messages.

    Raises:
        ConfigError: unknown or missing key, wrong type, or invalid value,
            naming the field's path.
    """
    where = f"{path}." if path else ""
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a table, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}{key}", f"unknown key{hint} (valid keys: {', '.join(fields)})")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = convert(hints[name], data[name], f"{where}{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}{name}", "is required")
    try:
        return cls(**kwargs)
    except ValueError as e:  # ConfigError, or a library parameter error naming its field the same way
        if not isinstance(getattr(e, "path", None), str) or not isinstance(getattr(e, "message", None), str):
            raise
        raise ConfigError(f"{where}{e.path}", e.message) from None


def to_dict(config: Any, drop_defaults: bool = False) -> Any:
    """Plain-data form of a config tree (tuples become lists).

    Args:
        config: A config dataclass (or a value inside one).
        drop_defaults: Leave out fields equal to their default (the form hashed).
    """
    if hasattr(config, "to_plain") and dataclasses.is_dataclass(config):
        return config.to_plain(drop_defaults)
    if dataclasses.is_dataclass(config):
        out = {}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if drop_defaults and f.default is not dataclasses.MISSING and value == f.default:
                continue
            out[f.name] = to_dict(value, drop_defaults)
        return out
    if isinstance(config, tuple):
        return [to_dict(v, drop_defaults) for v in config]
    return config


def canonical_json(config: Any) -> str:
    """Sorted, compact JSON of ``config`` without defaulted fields."""
    return json.dumps(to_dict(config, drop_defaults=True), sort_keys=True, separators=(",", ":"))


def config_hash(config: Any) -> str:
    """SHA-256 hex digest of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def load_toml(path: str | Path) -> dict[str, Any]:
    """The plain data of a TOML file.

    Raises:
        ConfigError: the file cannot be read or is not TOML (UTF-8).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError("", f"cannot read config {str(p)!r}: {e.strerror or e}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("", f"{str(p)!r} is not valid TOML: {e}") from None
