"""The session's patches of upstream internals (jupyterhub-singleuser, jupyter_core, JupyterLab,
jupyter_server, jupyter-server-proxy, jupyter_client, ipykernel, TensorBoard, aiohttp), in one place,
with what each rests on.

Each function here replaces, wraps or overrides something upstream keeps private; the session's
modules call them (singleuser.py, activity.py, portguard.py, tensorboards.py, kernelsockets.py) and
keep the portal's policy, messages and logs. Three patches stay where they are, listed here all
the same: kernelpipe.py is loaded on its own into container kernels (no dsportal there), so it
cannot import this module; kerneldebugger.py and magics.py (%tensorboard) are loaded by every host
kernel, whose start this module's imports would lengthen (the checklist's, importlib.metadata's).
:data:`PATCHES` is the upgrade checklist: for each patch, the upstream version it was written
against and fingerprints of the upstream code it rests on. tests/test_upstream.py fails, naming the
patch, when the installed upstream no longer matches. The hub's patches are in
portal/hub/upstream.py.

Imported at every session's start (singleuser.py): upstream modules are imported where used, not here.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import ssl
import sys
import types
from pathlib import Path

from .. import sessionvars
from ..patchcheck import Definition, Mentions, Patch
from .onuse import LoadOnUse, ModuleOnUse, OnUse


# ------------------------------------------------------------------ jupyterhub-singleuser's imports
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


def call_the_hub_through_tornado() -> None:
    """jupyterhub-singleuser calls its hub through jupyterhub.httpclient, on aiohttp, whose import
    is ~0.2 CPU-s of every session start (a fifth of it). That module's place is taken by
    portal.session.hubhttp (the same ``fetch``, on tornado's client); jupyterhub.utils and
    jupyter-server-proxy, which import aiohttp for code a session runs rarely or never
    (jupyterhub.utils' waits for the hub's own servers, jupyter-server-proxy's processes started
    on demand), get it loaded on first use. Before jupyterhub.singleuser is imported."""
    if "jupyterhub.httpclient" in sys.modules:
        return
    from . import hubhttp

    sys.modules["jupyterhub.httpclient"] = hubhttp
    sys.modules.setdefault("aiohttp", ModuleOnUse("aiohttp"))


def resolve_names_in_threads() -> None:
    """aiohttp (the session's calls to the hub) resolves names with c-ares when aiodns is installed,
    as JupyterHub requires it for the hub: importing it costs 30 ms of every session start, which
    resolves one name, the hub's. Sessions use aiohttp's threaded resolver (the system's
    getaddrinfo, /etc/hosts and nsswitch included)."""
    sys.modules.setdefault("aiodns", None)  # None: `import aiodns` raises ImportError


# ------------------------------------------------------------------ jupyter_core.paths.jupyter_config_path
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
    import jupyter_core.paths

    home = Path.home().resolve()
    kept = tuple(path for path in jupyter_core.paths.jupyter_config_path()
                 if not Path(path).resolve().is_relative_to(home))
    jupyter_core.paths.jupyter_config_path.__code__ = _the_paths.__code__
    jupyter_core.paths.jupyter_config_path.__kwdefaults__ = {"paths": kept}
    _nbextensions_without_ipythons_folder()


def _nbextensions_path(self) -> list[str]:
    """notebook_shim's NotebookAppTraits.nbextensions_path, without IPython's folder in the home."""
    from jupyter_core.paths import jupyter_path

    return self.extra_nbextensions_path + jupyter_path("nbextensions")


def _nbextensions_without_ipythons_folder() -> None:
    """notebook_shim (loaded with JupyterLab, for the classic notebook's config) adds
    ~/.ipython/nbextensions to the notebook extension folders, importing IPython for it (~0.05
    CPU-s of every session start; the server runs no IPython, its kernels do): a folder of the
    home, which disable_user_config leaves out like the others. JupyterLab serves no classic
    notebook extensions anyway."""
    from notebook_shim.traits import NotebookAppTraits

    NotebookAppTraits.nbextensions_path = property(_nbextensions_path, doc=NotebookAppTraits.nbextensions_path.__doc__)


# ------------------------------------------------------------------ names JupyterLab takes, loaded on use
class _NamesOnUse(types.ModuleType):
    """In sys.modules while another module imports from it: every name taken is an OnUse."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's questions are not names taken
            raise AttributeError(name)
        return OnUse(self.__name__, name)


def _import_with_stand_ins(module: str, stand_ins: dict[str, types.ModuleType]) -> None:
    """Import ``module`` while ``stand_ins`` answer for the modules they name, then take them out of
    sys.modules (and out of a real parent package that took one as its attribute). Nothing to do
    where ``module`` or any of them is imported already."""
    if module in sys.modules or any(name in sys.modules for name in stand_ins):
        return
    sys.modules.update(stand_ins)
    try:
        importlib.import_module(module)
    finally:
        for name in stand_ins:
            del sys.modules[name]
    for name, stand_in in stand_ins.items():
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is stand_in:
            delattr(sys.modules[parent], child)


def _import_taking_names_on_use(module: str, source: str) -> None:
    """Import ``module`` while ``source`` is a stand-in: each name ``module`` takes from it is an
    OnUse, which imports the real ``source`` when first called."""
    _import_with_stand_ins(module, {source: _NamesOnUse(source, f"stand-in while {module} is imported")})


def semver_on_use() -> None:
    """jupyterlab.commands takes six functions and a class from jupyter_builder's semver module,
    which compiles its regular expressions as it is imported (~15 ms of every session start), for
    the version checks of builds and installs that sessions never run. They are taken as OnUse
    names, each loading the module when first called. Before JupyterLab is imported."""
    _import_taking_names_on_use("jupyterlab.commands", "jupyter_builder.jupyterlab_semver")


def leave_out_the_pypi_extension_manager() -> None:
    """jupyterlab.extensions imports its PyPI extension manager (httpx, xmlrpc, async_lru: ~30 ms of
    every session start) for the Extension Manager's "pypi" mode; sessions run it read-only
    (jupyter_lab_config.json). The class is taken as an OnUse name, which loads the real one when
    the manager is built (an admin who sets LabApp.extension_manager back to "pypi"). Before
    JupyterLab is imported."""
    semver_on_use()  # jupyterlab.extensions imports jupyterlab.commands
    _import_taking_names_on_use("jupyterlab.extensions", "jupyterlab.extensions.pypi")


# ------------------------------------------------------------------ TLS to the hub: one context, the hub's CAs
TLS_CONTEXT_MODULES = ("jupyterhub.services.auth", "jupyterhub.singleuser.extension", "jupyterhub.singleuser.mixins")
_TLS_CONTEXTS: dict = {}


def hub_tls_context(keyfile, certfile, cafile=None, purpose=ssl.Purpose.SERVER_AUTH, **deprecated):
    """jupyterhub.utils.make_ssl_context for the session's calls to its hub, built once per set of
    files (and their modification times), trusting the hub's internal CA bundle only. JupyterHub
    builds a new context for every call to the hub's API (a token check, the port report) and adds
    the system's CA store to each (load_default_certs: ~30 ms of CPU, 3-4 times in every session's
    start); a certificate from a public CA is never the hub's. Without a CA bundle (or with
    JupyterHub's deprecated arguments) JupyterHub's own function answers."""
    from jupyterhub.utils import make_ssl_context

    if not keyfile or not certfile or not cafile or deprecated:
        return make_ssl_context(keyfile, certfile, cafile=cafile, purpose=purpose, **deprecated)
    key = (purpose, *((path, os.stat(path).st_mtime_ns) for path in (keyfile, certfile, cafile)))
    if key not in _TLS_CONTEXTS:
        context = ssl.create_default_context(purpose, cafile=cafile)  # with a cafile: that bundle only
        context.verify_mode = ssl.CERT_REQUIRED
        if purpose == ssl.Purpose.SERVER_AUTH:
            context.check_hostname = True
        context.load_cert_chain(certfile, keyfile)
        _TLS_CONTEXTS.clear()
        _TLS_CONTEXTS[key] = context
    return _TLS_CONTEXTS[key]


def one_tls_context_for_the_hub() -> None:
    """The jupyterhub modules a session loads (jupyterhub.singleuser's, HubAuth's) build their TLS
    contexts for the hub with :func:`hub_tls_context`. After jupyterhub.singleuser is imported."""
    for name in TLS_CONTEXT_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "make_ssl_context", None) is not hub_tls_context:
            module.make_ssl_context = hub_tls_context


class _SystemStoreOnFirstUse(ssl.SSLContext):
    """tornado's default client context, as ssl.create_default_context() makes it (the system's CA
    store, hostnames checked), the store loaded when a connection first uses it."""

    _loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self.load_default_certs(ssl.Purpose.SERVER_AUTH)
            self._loaded = True

    def wrap_socket(self, *args, **kwargs):
        self._load()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args, **kwargs):
        self._load()
        return super().wrap_bio(*args, **kwargs)


_TORNADO_DEFAULT: list = []


def _tornado_client_defaults() -> ssl.SSLContext:
    if not _TORNADO_DEFAULT:
        context = _SystemStoreOnFirstUse(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
        context.options |= ssl.OP_NO_COMPRESSION  # as tornado's own
        _TORNADO_DEFAULT.append(context)
    return _TORNADO_DEFAULT[0]


def system_store_on_first_use() -> None:
    """tornado makes its default client TLS context, loading the system's CA store (~30-50 ms of
    CPU), when the session's server accepts its first TLS connection (from the proxy or the hub):
    every SSLIOStream keeps one, though a stream the server accepts is wrapped already and never
    uses it. Here that context loads the store when a connection first wraps a socket with it: a
    client of tornado's that names no CAs of its own, never the server."""
    import tornado.iostream
    import tornado.netutil

    for module in (tornado.netutil, tornado.iostream):
        module._client_ssl_defaults = _tornado_client_defaults


# ------------------------------------------------------------------ jupyter_events, loaded when something listens
EVENT_MODULES = ("jupyter_events", "jupyter_events.logger", "jupyter_events.schema_registry")


class SchemaRegistryException(Exception):
    """jupyter_events' SchemaRegistryException (a schema's id registered twice), this class wherever
    it is named: jupyter_server's kernel manager catches it by the name it took at import, and once
    jupyter_events loads, its registry raises this one (_real_event_logger)."""


class EventLoggerOnUse:
    """jupyter_events' EventLogger, loaded when something listens to events (a handler configured, a
    listener added, a client on the events websocket) or asks for anything else of it. Until then
    the schemas it is given are kept, in order, and events are dropped, as the real one drops them
    when nothing listens. jupyter_server's modules take this class as their EventLogger while
    jupyter_server.serverapp imports (events_on_use); its instances pass their traits' checks."""

    _real = None

    def __init__(self, *args, **kwargs):
        self._arguments = (args, kwargs)
        self._schemas: list = []
        parent = kwargs.get("parent")
        if "EventLogger" in (getattr(parent, "config", None) or {}):  # handlers configured: they listen
            self._load()

    def _load(self):
        if self._real is None:
            args, kwargs = self._arguments
            self._real = _real_event_logger()(*args, **kwargs)
            for schema in self._schemas:
                try:
                    self._real.register_event_schema(schema)
                except SchemaRegistryException:  # given twice (jupyter_server's kernel manager re-registers)
                    pass
        return self._real

    def register_event_schema(self, schema) -> None:
        if self._real is not None:
            self._real.register_event_schema(schema)
        elif not any(schema == known for known in self._schemas):
            self._schemas.append(schema)

    def emit(self, *, schema_id: str, data: dict, timestamp_override=None):
        if self._real is None:
            return None  # what the real EventLogger returns when no handler or listener takes the event
        return self._real.emit(schema_id=schema_id, data=data, timestamp_override=timestamp_override)

    async def gather_listeners(self) -> list:
        return await self._real.gather_listeners() if self._real is not None else []

    def __getattr__(self, name):
        if name.startswith("_"):  # copy, pickle and traitlets' questions are not a use
            raise AttributeError(name)
        return getattr(self._load(), name)


def _real_event_logger():
    """jupyter_events' EventLogger class, its registry raising :class:`SchemaRegistryException`."""
    registry = importlib.import_module("jupyter_events.schema_registry")
    registry.SchemaRegistryException = SchemaRegistryException
    return importlib.import_module("jupyter_events.logger").EventLogger


def events_on_use() -> None:
    """jupyter_server builds an EventLogger at start and registers its event schemas: jupyter_events
    loads PyYAML (whose reader compiles a regular expression over all of Unicode), its metaschemas,
    python-json-logger and a package lookup, ~30 ms of every session start, for events that nothing
    listens to unless a browser opens the events websocket. jupyter_server's modules take
    :class:`EventLoggerOnUse` and :class:`SchemaRegistryException` in their place while
    jupyter_server.serverapp imports. Before jupyterhub.singleuser is imported."""
    stand_ins = {name: types.ModuleType(name, "stand-in while jupyter_server.serverapp is imported")
                 for name in EVENT_MODULES}
    stand_ins["jupyter_events"].__path__ = []
    stand_ins["jupyter_events"].EventLogger = stand_ins["jupyter_events.logger"].EventLogger = EventLoggerOnUse
    stand_ins["jupyter_events.schema_registry"].SchemaRegistryException = SchemaRegistryException
    _import_with_stand_ins("jupyter_server.serverapp", stand_ins)


# ------------------------------------------------------------------ jupyterlab.commands._yarn_config
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


# ------------------------------------------------------------------ entry points, read once while the server starts
_ENTRY_POINT_SCAN: dict = {"starting": False, "all": None}


def _replace_once(owner, name: str, replacement_of) -> None:
    """``owner.name`` replaced by ``replacement_of(the original)``, marked as the portal's
    (:func:`_is_replaced`); nothing if it is already: each patch below is idempotent so."""
    if _is_replaced(owner, name):
        return
    replacement = replacement_of(getattr(owner, name))
    replacement._dsportal = True
    setattr(owner, name, replacement)


def _is_replaced(owner, name: str) -> bool:
    return getattr(getattr(owner, name, None), "_dsportal", False)


def read_entry_points_once_while_starting() -> None:
    """importlib.metadata.entry_points reads the entry points of every installed package (~150 here)
    on each call. While a session's server starts, JupyterLab's extension managers and
    jupyter-server-proxy's servers each asked for one group: two full reads. Until
    :func:`read_entry_points_again` (the server serves: singleuser.started) they are read once and each call selects
    from that; afterwards every call reads afresh, so a package installed while the session runs is
    found as before. Before jupyterlab.extensions and jupyter_server_proxy are imported (they take
    the function by name). Idempotent."""
    import importlib.metadata

    _replace_once(importlib.metadata, "entry_points", _read_once)
    _ENTRY_POINT_SCAN["starting"] = True


def _read_once(read):
    def entry_points(**params):
        if not _ENTRY_POINT_SCAN["starting"]:
            return read(**params)
        if _ENTRY_POINT_SCAN["all"] is None:
            _ENTRY_POINT_SCAN["all"] = read()
        return _ENTRY_POINT_SCAN["all"].select(**params)

    entry_points.__doc__ = read.__doc__
    return entry_points


def read_entry_points_again() -> None:
    """The end of :func:`read_entry_points_once_while_starting`: each call reads them all again."""
    _ENTRY_POINT_SCAN.update(starting=False, all=None)


def _parse_nothing(parse):
    def parse_command_line(self, argv=None):
        if argv is None:
            argv = sys.argv[1:]
        if argv or "_ARGCOMPLETE" in os.environ:  # something to parse (or shell completion asking)
            return parse(self, argv)
        self.argv, self.extra_args = [], []
        return None

    return parse_command_line


def nothing_to_parse_on_an_empty_command_line() -> None:
    """traitlets' Application.parse_command_line builds an argparse parser of every alias and flag
    and of every configurable trait of every class the application lists, to parse no arguments at
    all: a session's server is started without any (its settings come from its environment and
    config files) and parsed its empty command line 4 times (the server, JupyterLab and the other
    extension apps). With an empty command line it now sets what parsing it would have (no
    arguments, none left over) and builds nothing. Idempotent."""
    from traitlets.config.application import Application

    _replace_once(Application, "parse_command_line", _parse_nothing)


def check_the_hub_once_serving() -> None:
    """jupyterhub-singleuser asks the hub for its version (and exits when it cannot reach it after 5
    tries) inside its initialize(), before the server listens: a round trip to the hub on every
    session's way to ready, 60 ms on an idle hub and the hub's whole queue while a class starts.
    A session that reports its port asks nothing more: the hub's answer to the report carries its
    version (every hub response does), which the report checks as jupyterhub-singleuser did
    (portal.session.portreport), and a hub that never answers the report ends the job in words.
    Any other server runs the same check as soon as its event loop runs. Idempotent."""
    from jupyterhub.singleuser.extension import JupyterHubSingleUser

    def deferred(check):
        async def check_hub_version(self):
            if os.environ.get(sessionvars.REPORT_PORT):  # set until the report goes
                return
            # initialize() runs this in run_sync: the task runs when the server's loop runs.
            self._dsportal_hub_check = asyncio.ensure_future(check(self))

        return check_hub_version

    _replace_once(JupyterHubSingleUser, "check_hub_version", deferred)


def no_activity_post_for_the_start() -> None:
    """jupyterhub-singleuser posts the server's last activity to the hub as it starts, then every
    JUPYTERHUB_ACTIVITY_INTERVAL. The first post only says that the server started, which the hub
    now records itself as it takes the session's port report (portal.hub.portreport: the idle clock
    starts there, not at the spawn request, before the queue): a request on the hub for every
    session, ~100 while a class of 100 starts. Here it is not sent when nothing happened since the
    start; every later post, and a first one after any activity, goes as before. Idempotent."""
    from jupyterhub.singleuser.extension import JupyterHubSingleUser

    def after_the_start(notify):
        async def notify_activity(self):
            if self._last_activity_sent is None:
                web_app = self.serverapp.web_app
                started, last = web_app.settings.get("started"), web_app.last_activity()
                if started is not None and last is not None and last <= started:
                    self._last_activity_sent = last  # the next post goes as the one after the first did
                    return
            await notify(self)

        return notify_activity

    _replace_once(JupyterHubSingleUser, "notify_activity", after_the_start)


# ------------------------------------------------------------------ jupyter_server's API activity
def count_api_activity_only(counts) -> None:
    """jupyter_server's ``APIHandler.update_api_activity`` records a request as activity only where
    ``counts(handler)`` is true. Idempotent."""
    from jupyter_server.base.handlers import APIHandler

    def counted(tracked):
        def update_api_activity(self) -> None:
            if counts(self):
                tracked(self)

        return update_api_activity

    _replace_once(APIHandler, "update_api_activity", counted)


# ------------------------------------------------------------------ jupyter-server-proxy's /proxy/ routes
def proxy_target_port(handler) -> int:
    """The port a jupyter-server-proxy handler is about to connect to."""
    from jupyter_server_proxy.handlers import NamedLocalProxyHandler, RemoteProxyHandler

    if isinstance(handler, NamedLocalProxyHandler):
        return int(handler.port)
    args = handler.path_args  # /proxy/<port>/..., /proxy/<host>:<port>/...
    return int(args[1] if isinstance(handler, RemoteProxyHandler) else args[0])


def _guarded(base, host_allowlist):
    class Guarded(base):
        def __init__(self, *args, **kwargs):
            kwargs["host_allowlist"] = host_allowlist
            super().__init__(*args, **kwargs)

    Guarded.__name__ = Guarded.__qualname__ = f"OwnServices{base.__name__}"
    return Guarded


def guard_proxy_routes(web_app, base_url: str, host_allowlist) -> int:
    """Every ``/proxy/...`` route of the server consults ``host_allowlist`` (jupyter-server-proxy
    asks it only for ``/proxy/<host>:<port>/``): its handler classes in the server's routes are
    replaced by subclasses that pass it. Returns how many routes were swapped; none (the proxy has
    not registered yet): the guarded routes are added, ahead of the proxy's own."""
    from jupyter_server.utils import url_path_join
    from jupyter_server_proxy.handlers import LocalProxyHandler, RemoteProxyHandler

    guarded = {LocalProxyHandler: _guarded(LocalProxyHandler, host_allowlist),
               RemoteProxyHandler: _guarded(RemoteProxyHandler, host_allowlist)}
    swapped = 0
    for router in (web_app.default_router, web_app.wildcard_router):
        for host_rule in router.rules:
            for rule in getattr(host_rule.target, "rules", []):
                if rule.target in guarded:
                    rule.target = guarded[rule.target]
                    swapped += 1
    if swapped:
        return swapped
    # jupyter-server-proxy has not registered yet: our routes come first, so they are the ones matched.
    routes = [(r"/proxy/([^/:@]+):(\d+)(/.*|)", RemoteProxyHandler, False),
              (r"/proxy/absolute/([^/:@]+):(\d+)(/.*|)", RemoteProxyHandler, True),
              (r"/proxy/(\d+)(/.*|)", LocalProxyHandler, False),
              (r"/proxy/absolute/(\d+)(/.*|)", LocalProxyHandler, True)]
    web_app.add_handlers(".*", [(url_path_join(base_url, pattern), guarded[handler], {"absolute_url": absolute})
                                for pattern, handler, absolute in routes])
    return 0


def unix_socket_proxy_handler(name: str, doc: str, target):
    """A jupyter-server-proxy ``ProxyHandler`` (its auth, header handling and streaming) for routes
    ``(<name>, <path>)``, pointed at a unix socket: ``target(handler, name)`` returns the socket's path
    and the handler's proxy_base (or raises tornado's HTTPError)."""
    from jupyter_server_proxy.handlers import ProxyHandler

    class UnixSocketProxyHandler(ProxyHandler):
        def _target(self, name):
            self.unix_socket, self.proxy_base = target(self, name)

        async def http_get(self, name, path):
            self._target(name)
            return await self.proxy("localhost", 0, path)

        async def open(self, name, path):
            self._target(name)
            return await self.proxy_open("localhost", 0, path)

        def post(self, name, path):
            self._target(name)
            return self.proxy("localhost", 0, path)

        def head(self, name, path):
            self._target(name)
            return self.proxy("localhost", 0, path)

    UnixSocketProxyHandler.__name__ = UnixSocketProxyHandler.__qualname__ = name
    UnixSocketProxyHandler.__doc__ = doc
    return UnixSocketProxyHandler


# ------------------------------------------------------------------ TensorBoard's program
def tensorboard_without_info_file():
    """TensorBoard's program, without its info file (it wants a TCP port; the portal's boards listen
    on unix sockets)."""
    from tensorboard import program

    class Board(program.TensorBoard):
        def _register_info(self, server):  # its info file wants a TCP port
            pass

    return Board


# ------------------------------------------------------------------ jupyter_client's kernel socket names
class IpcSocketsNamedByPrefix:
    """Mixin for a jupyter_client kernel manager: with the ipc transport, its kernel's sockets are
    named after ``self.ipc_socket_prefix()`` instead of the connection file's name."""

    def _ip_default(self) -> str:
        # The name jupyter_client's own default has: traitlets prefers a class's _ip_default.
        if self.transport != "ipc":
            return super()._ip_default()
        return self.ipc_socket_prefix()


# ------------------------------------------------------------------ the checklist
def _patched_code(module: str, function: str, code) -> bool:
    loaded = sys.modules.get(module)
    return loaded is not None and getattr(loaded, function).__code__ is code


def _kernel_pipe_in_place() -> bool:
    from ipykernel import kernelapp

    return getattr(kernelapp.IOPubThread, "_dsportal_private_pipe", False)


def _debugger_waits_for_first_use() -> bool:
    return type(sys.modules.get("ipykernel.debugger")).__name__ == "_StandIn"


def _hub_check_deferred() -> bool:
    from jupyterhub.singleuser.extension import JupyterHubSingleUser

    return _is_replaced(JupyterHubSingleUser, "check_hub_version")


def _api_activity_wrapped() -> bool:
    from jupyter_server.base.handlers import APIHandler

    return _is_replaced(APIHandler, "update_api_activity")


JUPYTERHUB, PROXY = "jupyterhub", "jupyter-server-proxy"
PROXY_HANDLERS = "jupyter_server_proxy.handlers"
PATCHES = [
    Patch("hub-database-left-out", "portal/session/singleuser.py",
          "jupyterhub.handlers.pages and sqlalchemy: stand-ins in sys.modules while jupyterhub.singleuser "
          "imports; the names jupyterhub modules took from them replaced", JUPYTERHUB, "6.1.1",
          "~0.2 CPU-s of every session start for the hub's ORM, pages and SQLAlchemy, which a session never runs",
          (Mentions("jupyterhub.log", "HealthCheckHandler", "5d2690f63a0a8778"),
           Mentions("jupyterhub.handlers", "pages", "085c337b8b5e99b5"),
           Mentions("jupyterhub.utils", "sqlalchemy", "4a7d3828acb3f46a"),
           Mentions("jupyterhub.scopes", "sqlalchemy", "be294fb944602074"),
           Mentions("jupyterhub.roles", "sqlalchemy", "09ff80a45bc22b9d")),
          lambda: type(sys.modules.get("jupyterhub.handlers.pages")) is types.ModuleType
          and not hasattr(sys.modules["jupyterhub.handlers.pages"], "__file__")),
    Patch("hub-calls-through-tornado", "portal/session/singleuser.py",
          "jupyterhub.httpclient in sys.modules (portal.session.hubhttp: fetch on tornado's client); aiohttp "
          "loaded on first use", JUPYTERHUB, "6.1.1",
          "~0.2 CPU-s of every session start for aiohttp, which loads the system's CA certificates at import",
          (Definition("jupyterhub.httpclient", "fetch", "0fa0cd70ddc36857"),
           Definition("jupyterhub.httpclient", "JupyterHubHTTPClient.fetch", "185d272b21927567"),
           Mentions("jupyterhub.singleuser.extension", "fetch", "50326e7f7956b652"),
           Mentions("jupyterhub.singleuser.mixins", "fetch", "7c94a94510c0c4a9"),
           Mentions("jupyterhub.services.auth", "fetch", "68c506f3dccead1b"),
           Definition("jupyterhub.services.auth", "HubAuth._api_request", "def0cc6578c8316f"),
           Definition("jupyterhub.singleuser.extension", "JupyterHubSingleUser.notify_activity", "dbd120d14f99a02c"),
           Mentions("jupyterhub.utils", "aiohttp", "b05d10c1ab70724c"),
           Mentions(PROXY_HANDLERS, "aiohttp", "4bc87dbc77e279b3")),
          lambda: getattr(sys.modules.get("jupyterhub.httpclient"), "__name__", "") == "portal.session.hubhttp"),
    Patch("aiodns-left-out", "portal/session/singleuser.py", "aiohttp.resolver's optional `import aiodns`",
          "aiohttp", "3.14.5", "30 ms of every session start for c-ares, to resolve one name",
          (Mentions("aiohttp.resolver", "aiodns", "0e1e33d11d878f93"),),
          lambda: "aiodns" in sys.modules and sys.modules["aiodns"] is None),
    Patch("user-config-path", "portal/session/singleuser.py",
          "jupyter_core.paths.jupyter_config_path (its __code__ replaced)", "jupyter_core", "5.9.1",
          "with disable_user_config, ~/.jupyter's page config and frontend config are not read either",
          (Definition("jupyter_core.paths", "jupyter_config_path", "a6f7b5390a2dddff"),
           Definition("jupyterhub.singleuser._disable_user_config", "_disable_user_config", "3f60c9ed4d539c34")),
          lambda: _patched_code("jupyter_core.paths", "jupyter_config_path", _the_paths.__code__)),
    Patch("nbextensions-without-ipython", "portal/session/singleuser.py",
          "notebook_shim.traits.NotebookAppTraits.nbextensions_path (property replaced)", "notebook_shim", "0.2.4",
          "with disable_user_config, ~/.ipython/nbextensions is left out too, and IPython (~0.05 CPU-s) is not "
          "imported into the server for it",
          (Definition("notebook_shim.traits", "NotebookAppTraits.nbextensions_path", "a67969f24dd79acd"),
           Mentions("notebook_shim.nbserver", "diff_members", "884a1b3cdd86d3d0")),
          lambda: getattr(sys.modules.get("notebook_shim.traits"), "NotebookAppTraits", None) is not None
          and sys.modules["notebook_shim.traits"].NotebookAppTraits.nbextensions_path.fget is _nbextensions_path),
    Patch("pypi-extension-manager-on-use", "portal/session/singleuser.py",
          "jupyterlab.extensions.pypi: a stand-in while jupyterlab.extensions imports (its PyPIExtensionManager "
          "an OnUse: loads the real class when called)", "jupyterlab", "4.6.6",
          "~30 ms of every session start for the PyPI client of an Extension Manager sessions run read-only",
          (Mentions("jupyterlab.extensions", "PyPIExtensionManager", "9052f280873990f2"),
           Mentions("jupyterlab.extensions", "pypi", "e8e71efca1219a22")),
          lambda: type(getattr(sys.modules.get("jupyterlab.extensions"), "PyPIExtensionManager", None)) is OnUse),
    Patch("entry-points-read-once", "portal/session/singleuser.py",
          "importlib.metadata.entry_points (wrapped while the server starts: read once, then selected from)",
          "jupyterlab", "4.6.6", "two reads of every installed package's entry points in every session's start "
          "(JupyterLab's extension managers, jupyter-server-proxy's servers)",
          (Mentions("jupyterlab.extensions", "entry_points", "ccbbc7f7be406b3a"),
           Mentions("jupyter_server_proxy.config", "entry_points", "f796f100ea5032bb")),
          lambda: _is_replaced(sys.modules["importlib.metadata"], "entry_points")),
    Patch("empty-command-line", "portal/session/singleuser.py",
          "traitlets.config.application.Application.parse_command_line (wrapped: an empty command line is not "
          "parsed)", "traitlets", "5.16.1", "every session server's start built 4 argparse parsers, of every "
          "configurable trait, for a command line without arguments",
          (Definition("traitlets.config.application", "Application.parse_command_line", "d727d4c3429ba771"),),
          lambda: _is_replaced(sys.modules["traitlets.config.application"].Application, "parse_command_line")),
    Patch("semver-on-use", "portal/session/singleuser.py",
          "jupyter_builder.jupyterlab_semver: a stand-in while jupyterlab.commands imports (its names OnUse)",
          "jupyterlab", "4.6.6", "~15 ms of every session start for version checks of builds sessions never run",
          (Mentions("jupyterlab.commands", "jupyterlab_semver", "061a7f75232b90b8"),
           Mentions("jupyterlab.commands", "Range", "576785eb230d94a5")),
          lambda: type(getattr(sys.modules.get("jupyterlab.commands"), "make_semver", None)) is OnUse),
    Patch("hub-tls-context", "portal/session/singleuser.py",
          "make_ssl_context in jupyterhub.services.auth, .singleuser.extension and .singleuser.mixins (replaced "
          "by hub_tls_context: one cached context, the hub's CA bundle only)", JUPYTERHUB, "6.1.1",
          "~30 ms of CPU for the system's CA store in each of 3-4 TLS contexts of every session's start; a "
          "certificate from a public CA is never the hub's",
          (Definition("jupyterhub.utils", "make_ssl_context", "b4476da2f6254157"),
           Mentions("jupyterhub.services.auth", "make_ssl_context", "ffc7bbe71b066abd"),
           Mentions("jupyterhub.singleuser.extension", "make_ssl_context", "00966b6ad1349966"),
           Mentions("jupyterhub.singleuser.mixins", "make_ssl_context", "00966b6ad1349966")),
          lambda: all(getattr(sys.modules.get(name), "make_ssl_context", hub_tls_context) is hub_tls_context
                      for name in TLS_CONTEXT_MODULES)),
    Patch("tornado-system-store-on-first-use", "portal/session/singleuser.py",
          "tornado.netutil._client_ssl_defaults and tornado.iostream's name for it (replaced: one context whose "
          "system CA store loads when a socket is first wrapped with it)", "tornado", "6.6.1",
          "~30-50 ms of CPU at every session's first TLS connection for a context that accepted streams keep "
          "and never use",
          (Definition("tornado.netutil", "_client_ssl_defaults", "d0b0c173c6ec316c"),
           Mentions("tornado.iostream", "_client_ssl_defaults", "ef45817d889c8ea4"),
           Mentions("tornado.simple_httpclient", "_client_ssl_defaults", "32c9f56fa44b0f27"),
           Mentions("tornado.netutil", "wrap_socket", "5f7bed88aefb064e")),
          lambda: sys.modules["tornado.iostream"]._client_ssl_defaults is _tornado_client_defaults),
    Patch("jupyter-events-on-use", "portal/session/singleuser.py",
          "jupyter_events, .logger and .schema_registry: stand-ins while jupyter_server.serverapp imports (its "
          "modules' EventLogger an EventLoggerOnUse, SchemaRegistryException this module's, also in the real "
          "registry once loaded)", "jupyter_events", "0.12.1",
          "~30 ms of every session start for PyYAML, the event metaschemas and python-json-logger, for events "
          "nothing listens to until a browser opens the events websocket",
          (Definition("jupyter_events.logger", "EventLogger.emit", "fc2695e676121ca1"),
           Definition("jupyter_events.logger", "EventLogger.__init__", "715bbc5213054f6b"),
           Definition("jupyter_events.schema_registry", "SchemaRegistry._add", "14eeef88f5672a4b"),
           Definition("jupyter_server.serverapp", "ServerApp.init_event_logger", "1d60c1d1321d7c56"),
           Mentions("jupyter_server.serverapp", "EventLogger", "b2f8d4c4b091594e"),
           Mentions("jupyter_server.services.contents.manager", "EventLogger", "ceef3e3040a345f9"),
           Mentions("jupyter_server.gateway.gateway_client", "EventLogger", "ceef3e3040a345f9"),
           Mentions("jupyter_server.services.kernels.kernelmanager", "EventLogger", "5171f67cdef19f77"),
           Mentions("jupyter_server.services.kernels.kernelmanager", "SchemaRegistryException", "ca815615910578ca"),
           Mentions("jupyter_server.services.events.handlers", "event_logger", "32deb97b02c7e361")),
          lambda: getattr(sys.modules.get("jupyter_server.serverapp"), "EventLogger", None) is EventLoggerOnUse),
    Patch("kernel-restart-callbacks", "portal/session/kernelsockets.py",
          "jupyter_server's ServerKernelManager.start_kernel (overridden by PrivateKernelManager: each kernel it "
          "starts gets activity.RESTART_CALLBACKS)", "jupyter_server", "2.21.1",
          "a kernel's restart callbacks without a listener on the kernel_actions event, which would load "
          "jupyter_events at every start and validate every kernel action",
          (Definition("jupyter_server.services.kernels.kernelmanager", "ServerKernelManager.start_kernel", "02cf08218ecd8e78"),
           Definition("jupyter_client.manager", "KernelManager.add_restart_callback", "9fa76d2d6fe6eb5b"),
           Definition("jupyter_client.manager", "KernelManager._async_post_start_kernel", "2e64e074f4e0bb55")),
          None),
    Patch("no-yarn-config", "portal/session/singleuser.py", "jupyterlab.commands._yarn_config (replaced)",
          "jupyterlab", "4.6.6", "a Node.js process (0.2 s) at every session start, for builds sessions never do",
          (Definition("jupyterlab.commands", "_yarn_config", "e9a6caa29a0f204f"),
           Mentions("jupyterlab.commands", "_yarn_config", "4e060257b14c8809")),
          lambda: getattr(sys.modules.get("jupyterlab.commands"), "_yarn_config", None) is _no_yarn_config),
    Patch("hub-check-once-serving", "portal/session/singleuser.py (and portreport.py: the report's answer checked)",
          "jupyterhub.singleuser.extension.JupyterHubSingleUser.check_hub_version (wrapped: none where the session "
          "reports its port, whose answer's version is checked with jupyterhub._version._check_version; "
          "else run as a task)",
          JUPYTERHUB, "6.1.1", "a round trip to the hub before the server listens, on every session's way to ready",
          (Definition("jupyterhub.singleuser.extension", "JupyterHubSingleUser.check_hub_version", "764fa5905b909d4e"),
           Mentions("jupyterhub.singleuser.extension", "check_hub_version", "cfdb3449332846c7"),
           Definition("jupyterhub._version", "_check_version", "48525574bec54b79")),
          _hub_check_deferred),
    Patch("no-activity-post-for-the-start", "portal/session/singleuser.py",
          "jupyterhub.singleuser.extension.JupyterHubSingleUser.notify_activity (wrapped: the first post is not "
          "sent when nothing happened since the server started)", JUPYTERHUB, "6.1.1",
          "a hub request for every session's start, which the hub records itself as it takes the port report "
          "(portal/hub/portreport.py; ~100 while a class of 100 starts)",
          (Definition("jupyterhub.singleuser.extension", "JupyterHubSingleUser.notify_activity", "dbd120d14f99a02c"),
           Definition("jupyterhub.singleuser.extension", "JupyterHubSingleUser.keep_activity_updated",
                      "ba5bd3bce1223bac"),
           Mentions("jupyterhub.user", "last_activity", "7341abcb9434f45c")),
          lambda: _is_replaced(sys.modules["jupyterhub.singleuser.extension"].JupyterHubSingleUser,
                               "notify_activity")),
    Patch("api-activity", "portal/session/activity.py",
          "jupyter_server.base.handlers.APIHandler.update_api_activity (wrapped)", "jupyter_server", "2.21.1",
          "an open tab's polling and layout saves must not count as use (idle limits)",
          (Definition("jupyter_server.base.handlers", "APIHandler.update_api_activity", "5e2cc5032912d37e"),
           Mentions("jupyter_server.base.handlers", "update_api_activity", "4f5c34055e5c4950")),
          _api_activity_wrapped),
    Patch("proxy-own-services", "portal/session/portguard.py",
          "jupyter-server-proxy's LocalProxyHandler / RemoteProxyHandler in the server's routes (subclassed, "
          "host_allowlist passed), handler.path_args, NamedLocalProxyHandler.port, unix_socket", PROXY, "4.6.0",
          "/proxy/<port>/ opens only its user's own services: jupyter-server-proxy asks host_allowlist only "
          "for /proxy/<host>:<port>/",
          (Definition(PROXY_HANDLERS, "setup_handlers", "7c2f09f0ebc8c1fd"),
           Definition(PROXY_HANDLERS, "ProxyHandler.__init__", "96c7e3608dd3fbdf"),
           Definition(PROXY_HANDLERS, "ProxyHandler._check_host_allowlist", "b5e60ce1dd21a2de"),
           Mentions(PROXY_HANDLERS, "_check_host_allowlist", "3517a63e102b83b6"),
           Definition(PROXY_HANDLERS, "LocalProxyHandler", "994ea1a484db8103"),
           Definition(PROXY_HANDLERS, "RemoteProxyHandler", "84f07c33e86939d6"),
           Definition(PROXY_HANDLERS, "NamedLocalProxyHandler", "7d8057650eb43529")),
          None),
    Patch("tensorboard-unix-socket-proxy", "portal/session/tensorboards.py",
          "jupyter-server-proxy's ProxyHandler (subclassed: unix_socket, proxy_base, proxy(), proxy_open())",
          PROXY, "4.6.0", "TensorBoards listen on unix sockets in the session's private folder, never on TCP",
          (Mentions(PROXY_HANDLERS, "unix_socket", "c467ecc14e7dbfee"),
           Mentions(PROXY_HANDLERS, "proxy_base", "abb96d9d0daf09a8"),
           Definition(PROXY_HANDLERS, "ProxyHandler.proxy", "ec858a5ef5357eb7"),
           Definition(PROXY_HANDLERS, "ProxyHandler.proxy_open", "4667bcfefce42ca4"),
           Definition(PROXY_HANDLERS, "ProxyHandler.http_get", "240b833c0c9545a6"),
           Definition(PROXY_HANDLERS, "ProxyHandler.open", "d0dae911ac23120a")),
          None),
    Patch("tensorboard-info-file", "portal/session/tensorboards.py",
          "tensorboard.program.TensorBoard._register_info (overridden) and its server_class protocol",
          "tensorboard", "2.21.0", "the info file wants a TCP port; the boards serve on unix sockets",
          (Definition("tensorboard.program", "TensorBoard._register_info", "535eafe95bd93bdd"),
           Definition("tensorboard.program", "TensorBoard._make_server", "efa5cd781a0f1780"),
           Mentions("tensorboard.program", "_register_info", "71df3b4f86194fa0"),
           Definition("tensorboard.program", "TensorBoardServer", "d79621e462ac5a31")),
          None),
    Patch("tensorboard-magic", "portal/session/magics.py",
          "tensorboard.notebook.start (replaced as the module is imported: onuse.after_import)",
          "tensorboard", "2.21.0", "%tensorboard in a kernel opens the session's own TensorBoard (a unix "
          "socket, through the session's server), not one on a TCP port of the node",
          (Definition("tensorboard.notebook", "_start_magic", "e831fbe4b36e6bd7"),
           Definition("tensorboard.notebook", "start", "e09c7483b1fa6ad7")),
          lambda: importlib.import_module("tensorboard.notebook").start.__module__ == "portal.session.magics"),
    Patch("kernel-socket-names", "portal/session/kernelsockets.py",
          "jupyter_client's ConnectionFileMixin._ip_default (overridden by name: traitlets' dynamic default)",
          "jupyter_client", "8.10.0", "a kernel's unix sockets named short enough for sun_path (107 bytes)",
          (Definition("jupyter_client.connect", "ConnectionFileMixin._ip_default", "bafb83f4e900928c"),
           Mentions("jupyter_client.connect", "self.ip", "85195b931df3fa67")),
          None),
    Patch("kernel-private-pipe", "portal/session/kernelpipe.py (self-contained: container kernels load a copy)",
          "ipykernel.kernelapp.IOPubThread (replaced by a subclass overriding _setup_pipe_in, _setup_pipe_out)",
          "ipykernel", "7.4.0", "the pipe for forked children's output on a private unix socket, not TCP",
          (Definition("ipykernel.iostream", "IOPubThread._setup_pipe_in", "6aa3dec968398fbe"),
           Definition("ipykernel.iostream", "IOPubThread._setup_pipe_out", "17f4168806073896"),
           Definition("ipykernel.iostream", "IOPubThread._handle_pipe_msg", "f4cf639f5692728e"),
           Mentions("ipykernel.kernelapp", "IOPubThread", "f14352462a48b92e")),
          _kernel_pipe_in_place),
    Patch("kernel-launcher", "portal/session/kernelstart.py (self-contained: the Python 3 kernel's launcher)",
          "ipykernel_launcher (replaced in the session's python3 kernelspec: the same launch, the GC paused while "
          "it loads); jupyter_client in sys.modules without its __init__ until a name only that gives is asked for",
          "ipykernel", "7.4.0", "~16 ms of GC and 42 modules of jupyter_client's kernel managers (~9 % of a "
          "kernel's imports) in every Python 3 kernel's start",
          (Mentions("ipykernel_launcher", "launch_new_instance", "c8d786b7a45713b9"),
           Mentions("ipykernel.connect", "jupyter_client", "d251038684e6f607"),
           Mentions("jupyter_client.connect", "BlockingKernelClient", "8a55d94c0bf3bfb2"),
           Mentions("jupyter_client", "import", "40174d2d3686eab5")),
          None),
    Patch("kernel-debugger-on-first-use", "portal/session/kerneldebugger.py (self-contained: loaded by kernels)",
          "ipykernel.debugger in sys.modules (a stand-in answering _is_debugpy_available and Debugger until the "
          "debugger is first used); IPythonKernel's debugger_class default", "ipykernel", "7.4.0",
          "debugpy and pydevd (~0.07-0.1 CPU-s, a sixth to a third of a kernel's start) load when the user "
          "opens the debugger, not in every kernel",
          (Definition("ipykernel.ipkernel", "IPythonKernel.__init__", "fdca0247a46fec24"),
           Definition("ipykernel.ipkernel", "IPythonKernel.poll_stopped_queue", "4ea3374432e319ab"),
           Definition("ipykernel.ipkernel", "IPythonKernel.dispatch_debugpy", "2b3d36f7103c29bd"),
           Definition("ipykernel.ipkernel", "IPythonKernel.do_debug_request", "a27b0dd91af158b8"),
           Mentions("ipykernel.ipkernel", "debugger", "6d9fac77cfd17cbc"),
           Mentions("ipykernel.kernelbase", "debugger", "eae5619cf218cfcc"),
           Definition("ipykernel.debugger", "Debugger.__init__", "739b1e0ce8c61b22")),
          _debugger_waits_for_first_use),
]
