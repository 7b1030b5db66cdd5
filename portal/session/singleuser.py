"""The session job's entry point: one Python process from the batch script to the serving Jupyter.

1. Writes this session's container kernelspecs (the catalog the batch script put in sessionvars.KERNEL_CATALOG)
   into the session's own folder (sessionvars.SESSION_DIR, on JUPYTER_PATH).
2. Picks a free port, puts it into JUPYTERHUB_SERVICE_URL and runs jupyterhub-singleuser in this
   process, without the hub's database layer and without asking yarn for a registry (below).
3. Once the server listens, the session extension reports the port and the Slurm job id to the hub
   (portal.session.portreport); a refused report ends the job with the hub's reason.

batchspawner-singleuser reports first and then starts the server, so the hub waits on its HTTP
back-off for a server that is still importing; and it needs a second Python for the kernelspecs.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import types
from pathlib import Path
from runpy import run_path
from shutil import which
from urllib.parse import urlparse, urlunparse

import jupyter_core.paths

from .. import sessionvars
from .kernels import write_catalog
from .onuse import LoadOnUse, OnUse

# What the batch script (templates/session.sbatch.j2) and this entry point hand on, in the environment.


def _import_without_sqlalchemy(name: str) -> None:
    """Import ``name`` (jupyterhub.singleuser) while a stand-in answers for SQLAlchemy (0.12 s of
    imports): jupyterhub.utils, .scopes and .roles import it at the top for code only the hub runs
    (catch_db_error, queries on ORM objects). Afterwards the stand-in is gone: the names those
    modules took from it import the real SQLAlchemy when first used (onuse.OnUse), as does
    jupyterhub.orm, but for jupyterhub.utils' SQLAlchemyError, which only the hub's database
    handlers catch. (Not a LazyLoader module in sys.modules: with one, `from sqlalchemy.orm
    import ...` as its first use failed half-way on Python 3.11.)"""
    if "sqlalchemy" in sys.modules:  # already loaded by something else: nothing to save
        importlib.import_module(name)
        return
    stand_in = types.ModuleType("sqlalchemy", "stand-in while jupyterhub's session side is imported")
    stand_in.__path__ = []
    stand_in.exc = types.ModuleType("sqlalchemy.exc")
    stand_in.exc.SQLAlchemyError = type("SQLAlchemyError", (Exception,), {"__module__": "sqlalchemy.exc"})
    stand_in.func = object()  # roles.py: `from sqlalchemy import func`
    sys.modules.update({"sqlalchemy": stand_in, "sqlalchemy.exc": stand_in.exc})
    try:
        importlib.import_module(name)
    finally:
        del sys.modules["sqlalchemy"], sys.modules["sqlalchemy.exc"]
    for module_name, module in list(sys.modules.items()):
        # type(), not an attribute: reading from a module that loads on use (jupyterhub.orm) loads it.
        if not module_name.startswith("jupyterhub.") or type(module) is not types.ModuleType:
            continue
        for attribute, value in list(vars(module).items()):
            if value is stand_in:
                setattr(module, attribute, OnUse("sqlalchemy"))
            elif value is stand_in.func:
                setattr(module, attribute, OnUse("sqlalchemy", "func"))


def leave_out_the_hubs_database() -> None:
    """jupyterhub.singleuser imports jupyterhub.log, which imports the hub's page handlers for one
    isinstance() test (is this request a hub health check?) and, through them and jupyterhub.metrics,
    the hub's ORM with SQLAlchemy's and alembic's: ~0.2 CPU-s of every session start for code that
    only the hub runs. The ORM module loads only if something uses it, the page handlers are a
    stand-in whose class no session request is an instance of, SQLAlchemy loads on first use
    (_import_without_sqlalchemy). JupyterLab's listings handler imports requests at the top for
    listings this portal does not configure: it loads on first use too."""
    sys.meta_path.insert(0, LoadOnUse({"jupyterhub.orm", "requests"}))
    if "jupyterhub.handlers.pages" not in sys.modules:
        pages = types.ModuleType("jupyterhub.handlers.pages", "stand-in: the hub's pages are not served here")
        pages.HealthCheckHandler = type("HealthCheckHandler", (), {})
        pages.default_handlers = []
        sys.modules[pages.__name__] = pages
    _import_without_sqlalchemy("jupyterhub.singleuser")


def resolve_names_in_threads() -> None:
    """aiohttp (the session's calls to the hub) resolves names with c-ares when aiodns is installed,
    as JupyterHub requires it for the hub: importing it costs 30 ms of every session start, which
    resolves one name, the hub's. Sessions use aiohttp's threaded resolver (the system's
    getaddrinfo, /etc/hosts and nsswitch included)."""
    sys.modules.setdefault("aiodns", None)  # None: `import aiodns` raises ImportError


def _the_paths(*, paths=()) -> list[str]:
    """Stands in for jupyter_core.paths.jupyter_config_path (its code; the list is its keyword default)."""
    return list(paths)


def leave_out_the_users_config_folders() -> None:
    """With JUPYTERHUB_DISABLE_USER_CONFIG (the hub's disable_user_config), jupyterhub-singleuser leaves
    the home's config files, extensions and data folders out (config_file_paths, jupyter_path), but not
    jupyter_config_path: JupyterLab's page config (labconfig/page_config.json: disabled extensions,
    where the page loads its code from) and the frontend config sections (nbconfig) would still be
    read from ~/.jupyter and ~/.local/etc/jupyter. Its code is replaced, as JupyterHub does for
    jupyter_path, so that modules which imported the function already get the list without the home."""
    if os.environ.get("JUPYTERHUB_DISABLE_USER_CONFIG", "") in ("", "0"):
        return
    home = Path.home().resolve()
    kept = tuple(path for path in jupyter_core.paths.jupyter_config_path()
                 if not Path(path).resolve().is_relative_to(home))
    jupyter_core.paths.jupyter_config_path.__code__ = _the_paths.__code__
    jupyter_core.paths.jupyter_config_path.__kwdefaults__ = {"paths": kept}


def _no_yarn_config(logger):
    return {"yarn config": {}, "npm config": {}}  # what JupyterLab uses where Node.js is not installed


def skip_yarn_config() -> None:
    """JupyterLab, as it loads, runs `node yarn.js config` (0.2 s, a Node.js process) for the npm
    registry it would build source extensions from: sessions never build JupyterLab (its assets are
    prebuilt in the environment, extensions come as wheels), so they skip it, as JupyterLab itself
    does where Node.js is missing. (Imported here: after leave_out_the_hubs_database, which
    decides how some of what JupyterLab imports is loaded.)"""
    import jupyterlab.commands

    jupyterlab.commands._yarn_config = _no_yarn_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def write_container_kernels() -> None:
    catalog, folder = os.environ.pop(sessionvars.KERNEL_CATALOG, ""), os.environ.get(sessionvars.SESSION_DIR, "")
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
    os.environ[sessionvars.REPORT_PORT] = "1"
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service_url:
        url = urlparse(service_url)
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{url.hostname}:{port}"))
    else:
        sys.argv.append(f"--port={port}")
    resolve_names_in_threads()
    leave_out_the_users_config_folders()
    leave_out_the_hubs_database()
    skip_yarn_config()
    command = which(sys.argv[1]) or sys.argv[1]
    sys.argv = sys.argv[1:]
    run_path(command, run_name="__main__")


if __name__ == "__main__":
    main()
