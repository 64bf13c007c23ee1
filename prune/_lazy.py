"""What ``import prune`` arranges for later, so that it can import neither TensorFlow nor Keras itself.

Two things used to happen at ``import prune`` because it imported everything:

* **prune's Keras classes registered with Keras's serialisation.** Keras finds
  the class of a layer in a ``.keras`` file by its registered name
  (``"prune>MaskedDense"``), which exists only once the module defining it has
  run; Keras imports modules by name only for its own packages. So once Keras
  is imported, by the user or by prune, the modules of :data:`SERIALIZABLE`
  are imported too, and ``import prune; keras.models.load_model(path)`` works
  as before.
* **The native op library loaded if already built** (:func:`prune.native.load_if_built`),
  so that a saved graph holding ``PruneSpmm``/``PruneSddmm`` loads after
  ``import prune``. That happens once TensorFlow is imported.

Each is a one-shot finder on ``sys.meta_path`` that lets the normal finders
find the module and runs the work right after the module's own code (if
the module is already imported, the work runs at once). If that moment falls
inside the import of a prune module (Keras imported for the first time by
``prune.layers.registry``, say), the work waits for the next chance: the next import
of anything, or :func:`settle`, which the Keras-side entry points call.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from typing import Any, Callable

__all__ = ["SERIALIZABLE", "install", "settle", "submodules"]

SERIALIZABLE = (
    "prune.layers.freezing",
    "prune.layers.masked",
    "prune.layers.sparse",
    "prune.layers.sparse_conv",
    "prune.layers.frozen",
    "prune.layers.masked_more",
    "prune.layers.blocks",
)
"""The modules that register classes with ``keras.saving``: the layer kinds (each with one
:func:`prune.layers.kinds.register_layer` call where it is defined) and ``prune.layers.freezing``'s constraints and
optimizer. A layer kind in a new module needs that module here, since its registration runs only on import."""

_lock = threading.RLock()
_pending: list[Callable[[], None]] = []


def _prune_initializing() -> bool:
    """Whether some prune module is part-way through its own import (running others' code then may see it half-made)."""
    for name, module in list(sys.modules.items()):
        # The package itself is excluded: install() runs at the end of its __init__, which defines everything
        # its submodules can need from it.
        if name.startswith("prune.") and getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


def settle() -> None:
    """Run the work that waited for a prune import to finish, if none is in progress now."""
    with _lock:
        if not _pending or _prune_initializing():
            return
        work, _pending[:] = list(_pending), []
    for fn in work:
        fn()


def _register_keras_side() -> None:
    from prune.core.schedules import register_with_keras

    register_with_keras()
    for name in SERIALIZABLE:
        if name not in sys.modules:
            importlib.import_module(name)


def _load_native() -> None:
    from prune import native

    native.load_if_built()


def _soon(fn: Callable[[], None]) -> None:
    with _lock:
        _pending.append(fn)
    settle()


class _After(importlib.abc.MetaPathFinder):
    """Runs ``then`` right after module ``name`` has been imported; otherwise finds nothing."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:  # (waiting work gets its chance at each import from _Settle)
            return None
        _remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            _soon(self.then)
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            run(module)
            _soon(then)

        spec.loader.exec_module = exec_module  # this spec's own loader object only
        return spec


class _Settle(importlib.abc.MetaPathFinder):
    """Finds nothing; gives waiting work its chance at each import."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if _pending:
            settle()
        return None


def _remove(finder: Any) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def _after_import(name: str, then: Callable[[], None]) -> None:
    if name in sys.modules:
        _soon(then)
    elif not any(isinstance(f, _After) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _After(name, then))


def install() -> None:
    """Called once by ``import prune``: the Keras registrations after Keras, the native ops after TensorFlow."""
    if not any(isinstance(f, _Settle) for f in sys.meta_path):
        sys.meta_path.insert(0, _Settle())
    _after_import("tensorflow", _load_native)
    _after_import("keras", _register_keras_side)


def submodules(package: str) -> Callable[[str], Any]:
    """A PEP 562 ``__getattr__`` for ``package``: ``package.<module>`` imports that module on first use.

    The subpackages (``prune.core``, ``prune.training``, ``prune.deploy``) use it, so that after ``import prune``
    an attribute path such as ``prune.training.dst.METHODS`` works as ``prune.<module>`` does.
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            module = importlib.import_module(f"{package}.{name}")
            setattr(sys.modules[package], name, module)
            return module
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
