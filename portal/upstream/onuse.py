"""dsportal's own modules loaded when first used, and changes made to a module once it is imported.

Every kernel of a session loads the %%horovod magic, and every session's server the job launcher;
the job machinery behind them (the rules, the settings' models, the Slurm client) is created empty
at start and runs the first time something reads from it (importlib's LazyLoader): only for
dsportal's own modules. :func:`after_import` makes a change to a module once whatever imports it
has imported it (%tensorboard's start, in a kernel that may never load TensorBoard).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types


def _other_finders_spec(finder, name, path, target):
    """The spec with a loader that the finders on sys.meta_path other than ``finder`` give for
    ``name`` (the first), or None."""
    for other in sys.meta_path:
        spec = None if other is finder or not hasattr(other, "find_spec") else other.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            return spec
    return None


def module_on_use(name: str) -> types.ModuleType:
    """dsportal's module ``name`` (already imported, or put in sys.modules now to load on first use)."""
    if not name.startswith(("portal.", "spawner.")):
        raise ValueError(f"only dsportal's own modules load on first use, not {name}")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


class _ThenLoader(importlib.abc.Loader):
    """``loader``, and ``then(module)`` once it has executed the module; the module keeps ``loader``
    as its own (tracebacks, inspect and reloads see the real one)."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.then(module)


class AfterImport(importlib.abc.MetaPathFinder):
    """On sys.meta_path until the module ``name`` is imported (by whatever imports it), then
    ``then(module)`` runs on it once: a change to a module that a session may never load, made
    without loading it. A question about the module that imports nothing (importlib.util.find_spec)
    leaves it waiting."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = _other_finders_spec(self, name, path, target)
        if spec is not None:
            spec.loader = _ThenLoader(spec.loader, self._imported)
        return spec

    def _imported(self, module) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.then(module)


def after_import(name: str, then) -> None:
    """``then(module)`` once the module ``name`` is imported: now if it is already, else when it is."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(f, AfterImport) and f.name == name and f.then == then for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(name, then))
