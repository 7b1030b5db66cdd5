"""The session's Python 3 kernel: ipykernel's launcher, with Python's cyclic garbage collector paused
while the kernel loads, and jupyter_client's client-side half loaded only if used.

A kernel's start creates ~100,000 objects that live as long as the kernel (modules, classes, the
shell and its traits) and hardly any garbage; with the collector on, it ran ~100 times while they
were made, each time looking over all of them again (~16 ms of a ~0.25 CPU-s start). Here the
collector is off until the kernel is built; then what the start made is frozen (gc.freeze: left
out of every later collection, which looks at what the user's code makes) and it runs again,
before the kernel answers anything.

A kernel needs jupyter_client's message layer (session, connection files, channels), but
``import jupyter_client`` also loads what starts and manages kernels (its managers, kernelspecs,
provisioners with an entry-point scan of every installed package, the asyncio client): 42 modules
and ~9 % of the instructions of a kernel's imports. Here the package is in place without its
``__init__`` until a name that only ``__init__`` gives is asked for (then it runs, whole); the names
ipykernel takes from it come from their own modules (:data:`NAMES`).

Otherwise this is ipykernel_launcher: the kernelspec runs it as
``python -P -m portal.session.kernelstart -f {connection_file}`` (-P: the notebook's folder is not
searched for this module; IPython puts it on sys.path for the user's imports, as it does with
ipykernel_launcher). Written into every session by portal.session.kernels.write_host_kernel.
Self-contained (standard library, ipykernel, and portal.compiledpatterns, itself standard library
only): listed in portal/session/upstream.py's PATCHES.
"""

import gc
import importlib
import importlib.util
import sys

# jupyter_client's top-level names a kernel takes, from the module that defines each.
NAMES = {
    "write_connection_file": "connect", "find_connection_file": "connect",  # ipykernel.connect
    "BlockingKernelClient": "blocking", "KernelClient": "client",  # ConnectionFileMixin's client classes
    "__version__": "_version", "version_info": "_version", "protocol_version": "_version",
    "protocol_version_info": "_version",
}


def jupyter_client_without_its_managers() -> None:
    """``jupyter_client`` in sys.modules as its package, its ``__init__`` not run: a name of
    :data:`NAMES` comes from its module; any other name runs ``__init__`` (the whole package, as
    before) and is read from it. Nothing if it is imported already."""
    if "jupyter_client" in sys.modules:
        return
    spec = importlib.util.find_spec("jupyter_client")
    if spec is None or spec.loader is None:
        return
    package = importlib.util.module_from_spec(spec)

    def __getattr__(name):
        if name in NAMES:
            return getattr(importlib.import_module(f"jupyter_client.{NAMES[name]}"), name)
        if name.startswith("__"):  # the import system's questions
            raise AttributeError(name)
        del package.__getattr__
        spec.loader.exec_module(package)  # the whole of jupyter_client, into this same module
        return getattr(package, name)

    package.__getattr__ = __getattr__
    sys.modules["jupyter_client"] = package


def main() -> None:
    gc.disable()
    from portal import compiledpatterns  # standard library only

    compiledpatterns.use()  # the regular expressions the kernel's imports compile, from the install's
    jupyter_client_without_its_managers()
    from ipykernel.kernelapp import IPKernelApp  # what ipykernel_launcher's launch_new_instance runs

    app = IPKernelApp.instance()
    app.initialize()
    gc.freeze()
    gc.enable()
    app.start()


if __name__ == "__main__":
    main()
