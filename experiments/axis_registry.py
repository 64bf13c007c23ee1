"""A registry is a dict plus ``register``; an unknown name lists the valid ones.

Each axis of the runner (datasets, models, implementations, schedule kinds,
methods; :mod:`experiments.axes`) is one :class:`Registry` of small frozen
objects. This module imports nothing of the experiments package, so
:mod:`experiments.config` can validate against the registries without cycles.
"""

from __future__ import annotations

import difflib
import importlib
import math
from typing import Any, Callable, Generic, Iterator, TypeVar

__all__ = ["ConfigError", "Registry", "choice", "check_range", "resolve"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem, with the dotted path of the field at fault."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


def choice(path: str, value: str, valid: tuple[str, ...], what: str) -> None:
    """Raise :class:`ConfigError` at ``path`` unless ``value`` is in ``valid``, naming the closest valid value."""
    if value not in valid:
        close = [v for v in valid if v.lower() == str(value).lower()] or difflib.get_close_matches(value, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(path, f"unknown {what} {value!r}{hint} (valid: {', '.join(valid)})")


def check_range(path: str, value: float, lo: float | None = None, hi: float | None = None, hi_open: bool = False) -> None:
    """Raise :class:`ConfigError` at ``path`` unless ``lo <= value <= hi`` (``< hi`` if ``hi_open``) and finite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, f"must be finite, got {value!r}")
    if lo is not None and value < lo:
        raise ConfigError(path, f"must be >= {lo}, got {value!r}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise ConfigError(path, f"must be {'<' if hi_open else '<='} {hi}, got {value!r}")


def resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """The function named ``"package.module:function"``, imported on first use (a callable is returned as is).

    Registry entries name the code that runs them this way, so that choosing an
    entry (in the runner's main process, or the tfmot process) imports nothing
    heavy, and no axis module has to import another.
    """
    if callable(target):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Generic[T]):
    """Named entries of one axis, in registration order.

    Args:
        what: The axis, singular (``"dataset"``), for error messages.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, entry: T) -> T:
        """Add ``entry`` under ``entry.name``; a name registered twice is a ``ValueError``."""
        name = getattr(entry, "name")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return the entry called ``name`` (for tests and interactive use)."""
        return self._entries.pop(name)

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def check(self, path: str, name: str) -> None:
        """Raise :class:`ConfigError` at ``path`` if ``name`` is not registered."""
        choice(path, name, self.names(), self.what)

    def get(self, name: str, path: str = "name") -> T:
        """The entry called ``name``, or :class:`ConfigError` naming the closest registered one."""
        self.check(path, name)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())
