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
    "prune.layers.sparse_einsum",
    "prune.layers.sparse_attention",
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
    """Run the work that waited for a prune import to finish, if none is in progress now.

    A watched module (:class:`_After`) found imported and fully run, though its finder never saw it run (a module
    loaded through a spec asked for earlier, or put into ``sys.modules`` by hand), has its work run now too.
    """
    for finder in [f for f in sys.meta_path if isinstance(f, _After)]:
        module = sys.modules.get(finder.name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            finder.fire()
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
    """Runs ``then`` once, right after module ``name`` has been imported; otherwise finds nothing.

    It stays on ``sys.meta_path`` until the module has run: ``importlib.util.find_spec(name)`` asks the finders
    without importing anything (TensorFlow's ``import tensorflow`` does so for ``"keras"``), and a finder that left
    at that question would miss the import that follows. Each spec it hands out runs ``then`` when its module is
    executed; :func:`settle` also runs it for a module that was imported some other way.
    """

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then
        self._asking = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._asking:  # (waiting work gets its chance at each import from _Settle)
            return None
        self._asking = True
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer (this one declines while asking)
        finally:
            self._asking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.fire()

        spec.loader.exec_module = exec_module  # this spec's own loader object only
        return spec

    def fire(self) -> None:
        """Leave ``sys.meta_path`` and run ``then`` (at once, or when no prune import is part-way); once only."""
        with _lock:
            if self not in sys.meta_path:
                return
            _remove(self)
        _soon(self.then)


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
