"""The session's patches of upstream internals (jupyterhub-singleuser, jupyter_core, jupyter_server,
jupyter-server-proxy, jupyter_client, ipykernel, TensorBoard), in one place, with what each rests on.

Each function here replaces, wraps or overrides something upstream keeps private; the session's
modules call them (singleuser.py, activity.py, portguard.py, tensorboards.py, kernelsockets.py, sharing.py) and
keep the portal's policy, messages and logs. Three patches stay where they are, listed here all
the same: kernelpipe.py is loaded on its own into container kernels (no dsportal there), so it
cannot import this module; kernelstart.py and magics.py (%tensorboard) are loaded by every host
kernel, which has no use for this checklist. :data:`PATCHES` is the upgrade checklist: for each
patch, the upstream version it was written against, fingerprints of the upstream code it rests on,
whether it guards users (a session does not start while such a patch is unchecked: singleuser.main)
and the public hook upstream would need to offer for it to go. tests/test_upstream.py fails, naming
the patch, when the installed upstream no longer matches. The hub's patches are in
portal/upstream/hub.py.

Imported at every session's start (singleuser.py): upstream modules are imported where used, not here.
"""

from __future__ import annotations

import importlib
import os
import ssl
import sys
from pathlib import Path

from portal.upstream.patchcheck import Definition, Mentions, Patch, stands_aside


# ------------------------------------------------------------------ jupyter_core.paths.jupyter_config_path
def _kept_config_paths(*, paths=()) -> list[str]:
    """Stands in for jupyter_core.paths.jupyter_config_path (its code; the list is its keyword default)."""
    return list(paths)


def exclude_home_config_paths() -> None:
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
    jupyter_core.paths.jupyter_config_path.__code__ = _kept_config_paths.__code__
    jupyter_core.paths.jupyter_config_path.__kwdefaults__ = {"paths": kept}


# ------------------------------------------------------------------ the guest gate (sharing.py)
def make_guest_gate(server_app, gate) -> None:
    """The server's JupyterHubIdentityProvider takes ``gate`` (its subclass, which adds no state) as its
    class: the same object, everywhere the server holds it, now judging guests. Idempotent."""
    from jupyterhub.singleuser.extension import JupyterHubIdentityProvider

    provider = getattr(server_app, "identity_provider", None)
    if type(provider) is JupyterHubIdentityProvider and issubclass(gate, JupyterHubIdentityProvider):
        provider.__class__ = gate


# ------------------------------------------------------------------ TLS with the hub: the hub's CA only
TLS_CONTEXT_MODULES = ("jupyterhub.services.auth", "jupyterhub.singleuser.extension", "jupyterhub.singleuser.mixins")
_TLS_CONTEXTS: dict = {}


def hub_tls_context(keyfile, certfile, cafile=None, purpose=ssl.Purpose.SERVER_AUTH, **deprecated):
    """jupyterhub.utils.make_ssl_context for the session's calls to its hub (token checks, OAuth, the
    version check, activity), trusting the hub's internal CA bundle only. JupyterHub adds the system's
    CA store to each context (load_default_certs): a certificate any public CA issued for the hub's
    name would pass as the hub's, and the session would send it its token. One context per set of
    files (and their modification times). Without a CA bundle (or with JupyterHub's deprecated
    arguments) JupyterHub's own function answers."""
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


def install_hub_tls_context() -> None:
    """The jupyterhub modules a session loads (jupyterhub.singleuser's, HubAuth's) build their TLS
    contexts with :func:`hub_tls_context`. Imports them (as jupyterhub-singleuser does). Idempotent."""
    for name in TLS_CONTEXT_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "make_ssl_context", None) is not hub_tls_context:
            module.make_ssl_context = hub_tls_context


# ------------------------------------------------------------------ jupyter_server's API activity
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


def count_api_activity_only(counts) -> None:
    """jupyter_server's ``APIHandler.update_api_activity`` records a request as activity only where
    ``counts(handler)`` is true (unless the patch stands aside: every request counts). Idempotent."""
    if stands_aside("api-activity"):
        return
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


def _api_activity_wrapped() -> bool:
    from jupyter_server.base.handlers import APIHandler

    return _is_replaced(APIHandler, "update_api_activity")


JUPYTERHUB, PROXY = "jupyterhub", "jupyter-server-proxy"
PROXY_HANDLERS = "jupyter_server_proxy.handlers"
PATCHES = [
    Patch("user-config-path", "portal/session/singleuser.py",
          "jupyter_core.paths.jupyter_config_path (its __code__ replaced)", "jupyter_core", "5.9.1",
          "with disable_user_config, ~/.jupyter's page config and frontend config are not read either",
          (Definition("jupyter_core.paths", "jupyter_config_path", "a6f7b5390a2dddff"),
           Definition("jupyterhub.singleuser._disable_user_config", "_disable_user_config", "3f60c9ed4d539c34")),
          lambda: _patched_code("jupyter_core.paths", "jupyter_config_path", _kept_config_paths.__code__),
          guards=True, hook="jupyterhub-singleuser's disable_user_config leaving the home out of "
          "jupyter_config_path too, as it does for jupyter_path"),
    Patch("guest-gate", "portal/session/sharing.py",
          "the server's jupyterhub.singleuser.extension.JupyterHubIdentityProvider (its __class__ set to "
          "sharing.GuestGate, a subclass overriding get_user; a token refused on HubAuth's cached answer is asked "
          "again, and get_user run once more after forgetting what the refusal left on the handler: "
          "_cached_hub_user, _jupyterhub_user, redirect; a refused guest's handler gets _jupyterhub_user, "
          "current_user and _jupyter_current_user None, as jupyter_server's own 403 does; one token's answer is "
          "dropped from HubAuth's cache by the key its user_for_token makes)", JUPYTERHUB, "6.1.1",
          "a guest of a shared session is judged on every request, before any handler runs: shareable, in the "
          "owner's sharing groups, still shared at the hub, never on the owner's own pages; a share made again at "
          "the hub's API lets him in within the recheck, not after HubAuth's 5-minute cache",
          (Definition("jupyterhub.singleuser.extension", "JupyterHubSingleUser.load_config_file", "cec29a3f6ca481a7"),
           Definition("jupyterhub.singleuser.extension", "JupyterHubIdentityProvider.get_user", "56c6e14099ce88f6"),
           Definition("jupyterhub.services.auth", "HubAuth._get_user", "1897c40681f02451"),
           Definition("jupyterhub.services.auth", "HubAuth.user_for_token", "40920e8de7ff5bd6"),
           Definition("jupyterhub.services.auth", "HubOAuth._get_user_cookie", "b830854e55159995")),
          None, guards=True, hook="jupyterhub-singleuser leaving ServerApp.identity_provider_class to the "
          "server's config where it names a subclass of JupyterHubIdentityProvider"),
    Patch("hub-tls-context", "portal/session/singleuser.py",
          "make_ssl_context in jupyterhub.services.auth, .singleuser.extension and .singleuser.mixins (replaced "
          "by hub_tls_context: the hub's CA bundle only)", JUPYTERHUB, "6.1.1",
          "JupyterHub adds the system's CA store to the session's TLS contexts for the hub: a certificate from a "
          "public CA for the hub's name would pass as the hub's, and get the session's token",
          (Definition("jupyterhub.utils", "make_ssl_context", "b4476da2f6254157"),
           Mentions("jupyterhub.services.auth", "make_ssl_context", "ffc7bbe71b066abd"),
           Mentions("jupyterhub.singleuser.extension", "make_ssl_context", "00966b6ad1349966"),
           Mentions("jupyterhub.singleuser.mixins", "make_ssl_context", "00966b6ad1349966")),
          lambda: all(getattr(sys.modules.get(name), "make_ssl_context", hub_tls_context) is hub_tls_context
                      for name in TLS_CONTEXT_MODULES),
          guards=True, hook="JupyterHub's internal TLS contexts trusting the internal CA bundle alone (an option "
          "of make_ssl_context, or of internal_ssl)"),
    Patch("api-activity", "portal/session/usage/activity.py",
          "jupyter_server.base.handlers.APIHandler.update_api_activity (wrapped)", "jupyter_server", "2.21.1",
          "an open tab's polling and layout saves must not count as use (idle limits)",
          (Definition("jupyter_server.base.handlers", "APIHandler.update_api_activity", "5e2cc5032912d37e"),
           Mentions("jupyter_server.base.handlers", "update_api_activity", "4f5c34055e5c4950")),
          _api_activity_wrapped,
          hook="a jupyter_server setting that decides which API requests count as activity"),
    Patch("proxy-own-services", "portal/session/tool/portguard.py",
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
          None, guards=True, hook="jupyter-server-proxy asking host_allowlist (or a port allowlist) for "
          "/proxy/<port>/ too"),
    Patch("tensorboard-unix-socket-proxy", "portal/session/tool/tensorboards.py",
          "jupyter-server-proxy's ProxyHandler (subclassed: unix_socket, proxy_base, proxy(), proxy_open())",
          PROXY, "4.6.0", "TensorBoards listen on unix sockets in the session's private folder, never on TCP",
          (Mentions(PROXY_HANDLERS, "unix_socket", "c467ecc14e7dbfee"),
           Mentions(PROXY_HANDLERS, "proxy_base", "abb96d9d0daf09a8"),
           Definition(PROXY_HANDLERS, "ProxyHandler.proxy", "ec858a5ef5357eb7"),
           Definition(PROXY_HANDLERS, "ProxyHandler.proxy_open", "4667bcfefce42ca4"),
           Definition(PROXY_HANDLERS, "ProxyHandler.http_get", "240b833c0c9545a6"),
           Definition(PROXY_HANDLERS, "ProxyHandler.open", "d0dae911ac23120a")),
          None, guards=True, hook="jupyter-server-proxy proxying to a unix socket for routes another "
          "extension adds (today: only for the server processes it starts itself)"),
    Patch("tensorboard-info-file", "portal/session/tool/tensorboards.py",
          "tensorboard.program.TensorBoard._register_info (overridden) and its server_class protocol",
          "tensorboard", "2.21.0", "the info file wants a TCP port; the boards serve on unix sockets",
          (Definition("tensorboard.program", "TensorBoard._register_info", "535eafe95bd93bdd"),
           Definition("tensorboard.program", "TensorBoard._make_server", "efa5cd781a0f1780"),
           Mentions("tensorboard.program", "_register_info", "71df3b4f86194fa0"),
           Definition("tensorboard.program", "TensorBoardServer", "d79621e462ac5a31")),
          None, hook="TensorBoard's program serving on a unix socket (or without its info file)"),
    Patch("tensorboard-magic", "portal/session/job/magics.py",
          "tensorboard.notebook.start (replaced as the module is imported: onuse.after_import)",
          "tensorboard", "2.21.0", "%tensorboard in a kernel opens the session's own TensorBoard (a unix "
          "socket, through the session's server), not one on a TCP port of the node",
          (Definition("tensorboard.notebook", "_start_magic", "e831fbe4b36e6bd7"),
           Definition("tensorboard.notebook", "start", "e09c7483b1fa6ad7")),
          lambda: importlib.import_module("tensorboard.notebook").start.__module__ == "portal.session.job.magics",
          hook="%tensorboard opening a board that something else serves, at a URL given to it"),
    Patch("kernel-socket-names", "portal/session/kernel/kernelsockets.py",
          "jupyter_client's ConnectionFileMixin._ip_default (overridden by name: traitlets' dynamic default)",
          "jupyter_client", "8.10.0", "a kernel's unix sockets named short enough for sun_path (107 bytes)",
          (Definition("jupyter_client.connect", "ConnectionFileMixin._ip_default", "bafb83f4e900928c"),
           Mentions("jupyter_client.connect", "self.ip", "85195b931df3fa67")),
          None, guards=True, hook="jupyter_client naming a kernel's ipc sockets by a configurable prefix"),
    Patch("kernel-private-pipe", "portal/session/kernel/kernelpipe.py (self-contained: container kernels load a copy)",
          "ipykernel.kernelapp.IOPubThread (replaced by a subclass overriding _setup_pipe_in, _setup_pipe_out)",
          "ipykernel", "7.4.0", "the pipe for forked children's output on a private unix socket, not TCP",
          (Definition("ipykernel.iostream", "IOPubThread._setup_pipe_in", "6aa3dec968398fbe"),
           Definition("ipykernel.iostream", "IOPubThread._setup_pipe_out", "17f4168806073896"),
           Definition("ipykernel.iostream", "IOPubThread._handle_pipe_msg", "f4cf639f5692728e"),
           Mentions("ipykernel.kernelapp", "IOPubThread", "f14352462a48b92e")),
          _kernel_pipe_in_place, guards=True, hook="ipykernel's pipe for forked output over the kernel's own "
          "transport (ipc) rather than TCP"),
    Patch("kernel-launcher", "portal/session/kernelstart.py (self-contained: the Python 3 kernel's launcher)",
          "ipykernel_launcher (replaced in the session's python3 kernelspec: the same launch, with the GC paused "
          "while it loads and what it loaded frozen)", "ipykernel", "7.4.0",
          "while a kernel loads, the GC looks again and again over the objects it keeps for its life",
          (Mentions("ipykernel_launcher", "launch_new_instance", "c8d786b7a45713b9"),),
          None, hook="a hook of ipykernel's launcher between the kernel's initialize() and start()"),
]
