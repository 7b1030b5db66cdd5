"""The session job's entry point: one Python process from the batch script to the serving Jupyter.

1. Checks the patches of upstream internals the session makes (portal/upstream/session.py): one that
   guards users and rests on upstream code that changed stops the start, in one line; and what the hub
   told the session (portal.core.sessionspec): a spec that does not validate stops it too.
2. Writes this session's kernelspecs into the session's own folder (sessionvars.SESSION_DIR, on
   JUPYTER_PATH): its Python 3 kernel's (portal.session.kernelstart) and its container images' (the
   catalog the batch script put in sessionvars.KERNEL_CATALOG).
3. Picks a free port, puts it into JUPYTERHUB_SERVICE_URL and runs jupyterhub-singleuser in this
   process, with the user's config folders left out and TLS with the hub trusting the hub's CA only,
   without the cyclic garbage collector until it serves (below).
4. Once the server listens, the session extension reports the port and the Slurm job id to the hub
   (portal.session.portreport); a refused report ends the job with the hub's reason.

batchspawner-singleuser reports first and then starts the server, so the hub waits on its HTTP
back-off for a server that is still importing; and it needs a second Python for the kernelspecs.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import threading
from pathlib import Path
from runpy import run_path
from shutil import which
from urllib.parse import urlparse, urlunparse

from jupyter_core.paths import jupyter_path

from portal.core import sessionspec, sessionvars
from portal.session.kernel.specs import write_catalog, write_host_kernel
from portal.session.tool.offer import Tools, sharing_groups, system_r_kernel, write_config, write_r_kernel
from portal.upstream import patchcheck, session as upstream


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def write_session_kernels() -> None:
    """The session's Python 3 kernel (kernels.write_host_kernel) and its container kernelspecs into
    the session's own folder."""
    catalog, folder = os.environ.pop(sessionvars.KERNEL_CATALOG, ""), os.environ.get(sessionvars.SESSION_DIR, "")
    if not folder:
        return
    try:
        write_host_kernel(Path(folder))
    except OSError as error:  # the environment's own kernelspec still starts it
        print(f"dsportal: the Python 3 kernel starts as ipykernel's ({error})", flush=True)
    write_tools(Path(folder))
    if not catalog:
        return
    try:
        for line in write_catalog(Path(folder), json.loads(catalog), os.path.expanduser("~"),
                                  os.environ.get("JUPYTER_RUNTIME_DIR", folder), os.environ.get("CUDA_VISIBLE_DEVICES")):
            print(f"dsportal: kernel {line}", flush=True)
    except Exception as error:  # noqa: BLE001 - the session itself must still start
        print(f"dsportal: container kernels unavailable ({error}); the Python 3 kernel still works", flush=True)


def write_tools(folder: Path) -> None:
    """What the profile offers besides notebooks (portal.session.tool.offer): the session's own config
    folder, first on JUPYTER_CONFIG_PATH, and the R kernel where R is offered and installed."""
    tools = Tools.from_env()
    try:
        config = write_config(folder, tools, shareable=bool(sharing_groups()))
    except OSError as error:
        print(f"dsportal: the profile's tools are not configured ({error}); all that is installed is offered", flush=True)
    else:
        os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
            [str(config), *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))])
    if not tools.offers("r"):
        return
    source = system_r_kernel([p for p in jupyter_path() if Path(p) != folder])
    try:
        line = write_r_kernel(folder, source, tools) if source else None
    except OSError as error:
        line = f"R not offered ({error})"
    print(f"dsportal: kernel {line or 'R not offered: IRkernel is not installed on this node'}", flush=True)


def import_lab_without_node() -> None:
    """jupyterlab.labapp asks Node.js for yarn's package registry as it is imported (its module-level
    get_app_version builds AppOptions, whose registry default runs ``node yarn.js config --json``): a
    process every start, for a registry only extension installs and builds use, and a session does
    neither (its Extension Manager is read-only). Imported here, before the server imports it, with
    PATH holding only this environment's bin (no Node.js there); then PATH as it was, for terminals,
    kernels and VS Code. JupyterLab's own answer without Node.js is its default registry."""
    path = os.environ.get("PATH")
    os.environ["PATH"] = os.path.join(sys.prefix, "bin")
    try:
        import jupyterlab.labapp  # noqa: F401 - the import is the point: done under the PATH above
    except ImportError:
        pass
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


def resume_gc() -> None:
    """The end of :func:`main`'s pause of Python's cyclic garbage collector, once the server serves.
    A session's start creates many objects that live as long as the server (modules, classes,
    traits, routes) and hardly any garbage; with the collector on, it ran again and again while
    they were made, each time looking over all of them again, a cost every start paid. They are
    frozen (gc.freeze: left out of every later collection, which looks at what the server makes
    while it serves) and the collector runs again (:func:`started`); nothing if the collector runs
    already (a server not started by main)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
        print("dsportal: serving; garbage collection on, the objects of the start left out of it", flush=True)


def started() -> None:
    """The server's start is over (it serves): Python's garbage collector runs again. Called by the
    session's extension as the server's loop starts, or by :func:`main`'s fallback timer."""
    resume_gc()


def check_patches() -> None:
    """The session's patches of upstream internals against the installed upstream code: exits in one
    line where a patch that guards users no longer fits (patchcheck.check_at_start)."""
    patchcheck.check_at_start(upstream.PATCHES, lambda line: print(line, flush=True))


GC_PAUSED_AT_MOST = 300.0  # seconds: the start counts as over then even if the extension never started


def check_spec() -> None:
    """What the hub told this session (sessionvars.SESSION), validated once: exits in one line if it does not
    validate (nothing of the session runs on settings it cannot trust)."""
    try:
        if os.environ.get("JUPYTERHUB_API_TOKEN") and not sessionspec.given():
            raise sessionspec.SpecError(f"its job has no {sessionvars.SESSION}: the hub that submitted it gives every "
                                        "session one; start it from the portal")
        sessionspec.current()
    except sessionspec.SpecError as error:
        print(f"dsportal: the session cannot start: {error}", flush=True)
        sys.exit(1)


def main() -> None:
    check_patches()
    check_spec()
    gc.disable()  # until the server serves: started()
    fallback = threading.Timer(GC_PAUSED_AT_MOST, started)  # a server without the extension
    fallback.daemon = True
    fallback.start()
    write_session_kernels()
    port = free_port()
    os.environ[sessionvars.REPORT_PORT] = "1"
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service_url:
        url = urlparse(service_url)
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{url.hostname}:{port}"))
    else:
        sys.argv.append(f"--port={port}")
    upstream.exclude_home_config_paths()
    upstream.install_hub_tls_context()
    import_lab_without_node()
    command = which(sys.argv[1]) or sys.argv[1]
    sys.argv = sys.argv[1:]
    run_path(command, run_name="__main__")


if __name__ == "__main__":
    main()
