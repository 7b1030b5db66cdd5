"""The session job's entry point: one Python process from the batch script to the serving Jupyter.

1. Writes this session's container kernelspecs (the catalog the hub put in DSPORTAL_KERNEL_CATALOG)
   into the session's own folder (DSPORTAL_SESSION_DIR, on JUPYTER_PATH).
2. Picks a free port, puts it into JUPYTERHUB_SERVICE_URL and runs jupyterhub-singleuser in this
   process, without the hub's database layer and without asking yarn for a registry (below).
3. Once the server listens, the session extension reports the port and the Slurm job id to the hub
   (portal.session.portreport); a refused report ends the job with the hub's reason.

batchspawner-singleuser reports first and then starts the server, so the hub waits on its HTTP
back-off for a server that is still importing; and it needs a second Python for the kernelspecs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import types
from pathlib import Path
from runpy import run_path
from shutil import which
from urllib.parse import urlparse, urlunparse

import jupyterlab.commands

from .kernels import write_catalog

# What the batch script (templates/session.sbatch.j2) and this entry point hand on, in the environment.
CATALOG_ENV = "DSPORTAL_KERNEL_CATALOG"  # the profile's images and data mounts (JSON), for kernelspecs
SESSION_DIR_ENV = "DSPORTAL_SESSION_DIR"  # the session's private folder (on JUPYTER_PATH)
REPORT_ENV = "DSPORTAL_REPORT_PORT"  # set: this server is a session job's and reports its port


class _LoadOnUse(importlib.abc.MetaPathFinder):
    """Modules named here are created empty and run only when something reads from them."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = importlib.util.LazyLoader(spec.loader)
                return spec
        return None


def leave_out_the_hubs_database() -> None:
    """jupyterhub.singleuser imports jupyterhub.log, which imports the hub's page handlers for one
    isinstance() test (is this request a hub health check?) and, through them and jupyterhub.metrics,
    the hub's ORM with SQLAlchemy's and alembic's: ~0.1 CPU-s of every session start for code that
    only the hub runs. The ORM module loads only if something uses it; the page handlers are a
    stand-in whose class no session request is an instance of."""
    sys.meta_path.insert(0, _LoadOnUse({"jupyterhub.orm"}))
    if "jupyterhub.handlers.pages" not in sys.modules:
        pages = types.ModuleType("jupyterhub.handlers.pages", "stand-in: the hub's pages are not served here")
        pages.HealthCheckHandler = type("HealthCheckHandler", (), {})
        pages.default_handlers = []
        sys.modules[pages.__name__] = pages


def _no_yarn_config(logger):
    return {"yarn config": {}, "npm config": {}}  # what JupyterLab uses where Node.js is not installed


def skip_yarn_config() -> None:
    """JupyterLab, as it loads, runs `node yarn.js config` (0.2 s, a Node.js process) for the npm
    registry it would build source extensions from: sessions never build JupyterLab (its assets are
    prebuilt in the environment, extensions come as wheels), so they skip it, as JupyterLab itself
    does where Node.js is missing."""
    jupyterlab.commands._yarn_config = _no_yarn_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def write_container_kernels() -> None:
    catalog, folder = os.environ.pop(CATALOG_ENV, ""), os.environ.get(SESSION_DIR_ENV, "")
    if not catalog or not folder:
        return
    try:
        for line in write_catalog(Path(folder), json.loads(catalog), os.path.expanduser("~"),
                                  os.environ.get("JUPYTER_RUNTIME_DIR", folder), os.environ.get("CUDA_VISIBLE_DEVICES")):
            print(f"dsportal: kernel {line}", flush=True)
    except Exception as error:  # noqa: BLE001 - the session itself must still start
        print(f"dsportal: container kernels unavailable ({error}); the Python 3 kernel still works", flush=True)


def main() -> None:
    write_container_kernels()
    port = free_port()
    os.environ[REPORT_ENV] = "1"
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service_url:
        url = urlparse(service_url)
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{url.hostname}:{port}"))
    else:
        sys.argv.append(f"--port={port}")
    leave_out_the_hubs_database()
    skip_yarn_config()
    command = which(sys.argv[1]) or sys.argv[1]
    sys.argv = sys.argv[1:]
    run_path(command, run_name="__main__")


if __name__ == "__main__":
    main()
