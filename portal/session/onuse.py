"""Modules loaded when first used: what a session's start would import only for later requests.

A session's server must answer the hub as soon as it can; code that only some later request
needs (the job launcher's, the hub's own) is created empty at start and runs the first time
something reads from it (importlib's LazyLoader). Nothing else about the module changes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types


def _spec_of_the_other_finders(finder, name, path, target):
    """The spec with a loader that the finders on sys.meta_path other than ``finder`` give for
    ``name`` (the first), or None."""
    for other in sys.meta_path:
        spec = None if other is finder or not hasattr(other, "find_spec") else other.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            return spec
    return None


class LoadOnUse(importlib.abc.MetaPathFinder):
    """On sys.meta_path: the modules named here, wherever they are imported, load on first use."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        spec = _spec_of_the_other_finders(self, name, path, target)
        if spec is not None:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def module_on_use(name: str) -> types.ModuleType:
    """The module ``name`` (already imported, or put in sys.modules now to load on first use)."""
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


class OnUse:
    """Stands for the module ``module`` (or its ``attribute``), imported the ordinary way when first
    used: for a name a module took at import time and reads only in code a session never runs
    (``import sqlalchemy as sa``, ``from sqlalchemy import func`` in jupyterhub.scopes and .roles),
    or calls only on request (JupyterLab's PyPI extension manager class)."""

    def __init__(self, module: str, attribute: str | None = None):
        self._module, self._attribute = module, attribute

    def _target(self):
        target = importlib.import_module(self._module)
        return getattr(target, self._attribute) if self._attribute else target

    def __getattr__(self, name):
        return getattr(self._target(), name)

    def __call__(self, *args, **kwargs):  # a class or function taken by name: built or called on use
        return self._target()(*args, **kwargs)


class ModuleOnUse(types.ModuleType):
    """In sys.modules in place of the module ``name``, not loaded yet: the first attribute read
    imports the real module, which takes its place in sys.modules, and answers from it. Unlike a
    LazyLoader module, importing it again elsewhere (``import aiohttp`` in a second module) does not
    load it: the import system reads only its ``__spec__``, the real module's, not initializing."""

    def __init__(self, name: str):
        super().__init__(name, f"stand-in: {name} loads when first used")
        self.__spec__ = importlib.util.find_spec(name)

    def __getattr__(self, attribute):
        name = vars(self)["__name__"]
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        vars(self).update(vars(real))  # later reads through this stand-in are plain attribute reads
        return getattr(real, attribute)


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
        spec = _spec_of_the_other_finders(self, name, path, target)
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
