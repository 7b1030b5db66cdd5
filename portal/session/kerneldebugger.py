"""ipykernel's debugger (debugpy) loaded when the user first opens it, not at every kernel's start.

ipykernel builds its Debugger in IPythonKernel.__init__, and importing ipykernel.debugger imports
debugpy and pydevd: ~0.1 CPU-s, a third of a kernel's start, for JupyterLab's debugger panel,
which most kernels never open. Here, until then, ``ipykernel.debugger`` in sys.modules is a
stand-in. It answers ``_is_debugpy_available`` (is debugpy installed: the kernel still announces
the "debugger" feature, and JupyterLab still shows the bug icon), and its ``Debugger`` keeps the
kernel's arguments. The first use of the debugger (a debug_request on the control channel) imports
the real module and builds ipykernel's own Debugger with those arguments; from then on the kernel
talks to it as before. Any other name read from the stand-in loads the real module too.

Self-contained (standard library and ipykernel only), called from the environment's
ipython_kernel_config.py before the kernel is built. Listed in portal/session/upstream.py's PATCHES.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import types

MODULE = "ipykernel.debugger"


class _StandIn(types.ModuleType):
    """ipykernel.debugger until the debugger is first used."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's questions (__path__, ...) are not a use
            raise AttributeError(name)
        return getattr(_real_module(), name)


def _real_module() -> types.ModuleType:
    """ipykernel's debugger module, imported now if the stand-in is still in its place."""
    module = sys.modules.get(MODULE)
    if module is not None and not isinstance(module, _StandIn):
        return module
    stand_in = sys.modules.pop(MODULE, None)
    try:
        module = importlib.import_module(MODULE)
    except BaseException:
        if stand_in is not None:
            sys.modules[MODULE] = stand_in
        raise
    import ipykernel

    ipykernel.debugger = module
    return module


class DebuggerOnFirstUse:
    """Stands for ipykernel's Debugger, built with the kernel's arguments the first time the kernel
    uses it (process_request for a debug_request, then debugpy's frames and events). The kernel's
    start waits on handle_stopped_event() at once (its control thread, forever): that waits until
    the debugger is built, then is the debugger's own."""

    def __init__(self, *args, **kwargs):
        self._arguments = (args, kwargs)
        self._debugger = None
        self._waiting: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def handle_stopped_event(self):
        if self._debugger is None:
            loop, built = self._waiting or (asyncio.get_running_loop(), asyncio.Event())
            self._waiting = (loop, built)
            await built.wait()
        await self._debugger.handle_stopped_event()

    def _built(self):
        if self._debugger is None:
            loaded = set(sys.modules)
            module = _real_module()
            args, kwargs = self._arguments
            kernel_modules = args[5] if len(args) > 5 else kwargs.get("kernel_modules")
            if isinstance(kernel_modules, list):  # debugpy's and pydevd's files are the kernel's own too
                kernel_modules.extend(getattr(sys.modules[name], "__file__", None) or "" for name in
                                      set(sys.modules) - loaded)
                kernel_modules[:] = [path for path in kernel_modules if path]
            self._debugger = module.Debugger(*args, **kwargs)
            if self._waiting is not None:
                loop, built = self._waiting
                loop.call_soon_threadsafe(built.set)
        return self._debugger

    def __getattr__(self, name):
        return getattr(self._built(), name)


def debugger_on_first_use() -> bool:
    """Put the stand-in in place; False (nothing changed) where the real module is already loaded,
    debugpy is not installed, or this ipykernel builds its debugger otherwise."""
    if MODULE in sys.modules:
        return isinstance(sys.modules[MODULE], _StandIn)
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:
        return False
    default = IPythonKernel.class_traits()["debugger_class"].default_value
    if default != f"{MODULE}.Debugger" or importlib.util.find_spec("debugpy") is None:
        return False
    stand_in = _StandIn(MODULE, "stand-in until the debugger is first used (portal.session.kerneldebugger)")
    stand_in._is_debugpy_available = True
    stand_in.Debugger = DebuggerOnFirstUse
    sys.modules[MODULE] = stand_in
    return True
