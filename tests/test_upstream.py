"""The portal's patches of upstream internals still fit the installed upstream (the checklist of an
upgrade: portal/upstream/hub.py and portal/upstream/session.py), are all applied where the portal
applies them, are all listed there, each with the public hook that would let it go; a hub or session
whose upstream changed under a patch that guards users does not start. No cluster needed."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.upstream import hub as hub_upstream, session as session_upstream

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent
PATCHES = [*hub_upstream.PATCHES, *session_upstream.PATCHES]


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_the_upstream_code_a_patch_rests_on_is_unchanged(patch):
    problems = patch.problems()
    assert not problems, "\n".join(problems)


def test_patch_names_are_unique():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names)), names


def test_every_patch_names_the_public_hook_that_would_let_it_go():
    assert [p.name for p in PATCHES if len(p.hook) < 20] == []


def _applied_in_a_fresh_python(script: str, **env) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/",
                         env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


HUB_APPLIES = """
import json
from traitlets.config import Config
from types import SimpleNamespace
from portal.hub import databasedown, origins, pacing, portreport, proxywatch, routeowner, sharing, useroptions
from portal.upstream import hub as upstream
# as config.configure and configure_internal_ssl do, in their order
origins.configure_user_origins(Config(), "http://hub.localhost:8000")
c = Config(); c.JupyterHub.template_vars = {}
sharing.configure(c, SimpleNamespace(sharing=SimpleNamespace(groups=["ml-lab"])))
useroptions.judge_before_storing()
portreport.install_port_handler()
pacing.install(pacing.Pacer())
proxywatch.install()
databasedown.install()
routeowner.check_sessions_by_their_certificate()
print(json.dumps([p.name for p in upstream.PATCHES if p.applied is not None and not p.applied()]))
"""

SESSION_APPLIES = """
import json
from portal.session.usage import activity
from portal.session.kernel import kernelpipe
from portal.session.job import magics
from portal.session import singleuser
from portal.upstream import session as upstream
# as singleuser.main does, then the session's extension and its kernels
singleuser.check_patches()
upstream.exclude_home_config_paths()
upstream.install_hub_tls_context()
activity.count_only_changes_as_use()
kernelpipe.private_iopub_pipe()
class Kernel:  # what magics' load_ipython_extension uses of IPython's shell
    def register_magic_function(self, *args, **kwargs): pass
    def push(self, *args, **kwargs): pass
magics.load_ipython_extension(Kernel())
print(json.dumps([p.name for p in upstream.PATCHES if p.applied is not None and not p.applied()]))
"""


def test_every_hub_patch_is_in_place_once_the_hub_configuration_ran():
    assert _applied_in_a_fresh_python(HUB_APPLIES) == []


def test_every_session_patch_is_in_place_once_the_session_started():
    assert _applied_in_a_fresh_python(SESSION_APPLIES, JUPYTERHUB_DISABLE_USER_CONFIG="1",
                                      JUPYTERHUB_SERVICE_URL="http://127.0.0.1:1/user/x/",
                                      JUPYTERHUB_API_TOKEN="not-used") == []


def test_the_patched_classes_use_the_upstream_module():
    """The patches made by subclassing are the upstream module's classes and functions."""
    from jupyter_server_proxy.handlers import ProxyHandler

    from portal.hub.auth import PortalAuthenticator
    from portal.session.kernel.kernelsockets import PrivateKernelManager
    from portal.session.tool.tensorboards import BoardProxyHandler

    assert issubclass(BoardProxyHandler, ProxyHandler)
    assert issubclass(PrivateKernelManager, session_upstream.IpcSocketsNamedByPrefix)
    manager = PrivateKernelManager(connection_file="/run/x/kernel-1a2b3c4d-0000.json")
    assert (manager.transport, manager.ip) == ("ipc", "/run/x/k1a2b3c4d")
    assert "get_connection" in vars(PortalAuthenticator)


def test_a_login_from_a_session_is_told_by_its_certificate_through_tornados_public_api():
    """auth.has_session_certificate reads the client's certificate with
    HTTPServerRequest.get_ssl_certificate: a session's names a user; a person's browser sends none;
    plain HTTP has no certificate at all."""
    import socket
    from types import SimpleNamespace

    from tornado.httputil import HTTPServerRequest

    from portal.hub.auth import has_session_certificate
    from spawner.certs import USERS_DOMAIN

    def login(tls_socket):
        connection = SimpleNamespace(stream=SimpleNamespace(socket=tls_socket), set_close_callback=lambda c: None,
                                     context=None)
        request = HTTPServerRequest("POST", "/hub/login", connection=connection)
        return has_session_certificate(SimpleNamespace(request=request))

    def presenting(certificate):
        return SimpleNamespace(getpeercert=lambda binary_form=False: certificate)

    session = {"subjectAltName": (("DNS", f"alice.{USERS_DOMAIN}"), ("DNS", "node1"))}
    with socket.socket() as plain:
        assert [login(presenting(session)), login(presenting(None)), login(presenting({})), login(plain)] \
            == [True, False, False, False]


# ------------------------------------------------------------------ nothing patches upstream elsewhere
UPSTREAM_PACKAGES = {"jupyterhub", "batchspawner", "wrapspawner", "ldapauthenticator", "jupyter_server",
                     "jupyter_server_proxy", "jupyter_client", "ipykernel", "tornado", "ssl", "jupyter_core",
                     "jupyterlab", "tensorboard", "aiohttp", "zmq", "ldap3", "werkzeug", "traitlets",
                     "jupyter_events", "notebook_shim", "sqlalchemy", "importlib", "re"}
# the homes of the patches; kernelpipe.py must stay self-contained (container kernels load a copy)
PATCH_HOMES = {"portal/upstream/hub.py", "portal/upstream/session.py", "portal/session/kernel/kernelpipe.py",
               "portal/upstream/onuse.py",  # onuse: dsportal's own modules loaded on first use (sys.modules)
               "portal/session/kernelstart.py"}  # the Python 3 kernel's launcher, alone as well
# The whole tree: every package's modules (the demo cluster's too), and the Python files the hub and sessions load
# as configuration.
SOURCES = sorted([p for folder in ("portal", "spawner", "democluster") for p in (REPO / folder).rglob("*.py")]
                 + [*(REPO / "config").glob("*.py"), *(REPO / "jupyter-config").glob("*.py")])
SCANNED = [p for p in SOURCES if str(p.relative_to(REPO)) not in PATCH_HOMES]
MODULES = [p for p in SCANNED if p.parts[len(REPO.parts)] in ("portal", "spawner", "democluster")
           and p.name not in ("__init__.py", "__main__.py")]


def _upstream_names(tree: ast.Module) -> set[str]:
    """Names a module binds to upstream modules or their members."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] in UPSTREAM_PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in UPSTREAM_PACKAGES:
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def patching_sites(path: Path) -> list[str]:
    """Assignments into upstream modules or classes, code swaps and sys.modules entries, in ``path``."""
    tree = ast.parse(path.read_text())
    upstream = _upstream_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and (_root(t) in upstream or t.attr in ("__code__", "__kwdefaults__")):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(t)} = ...")
                if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules":
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(t)} = ...")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                ast.unparse(node.func.value) == "sys.modules" and node.func.attr in ("update", "setdefault"):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args \
                and _root(node.args[0]) in upstream:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_the_upstream_ones_patches_upstream():
    sites = [site for path in SCANNED for site in patching_sites(path)]
    assert not sites, ("these patch upstream outside portal/upstream/hub.py and portal/upstream/session.py: "
                       "move them there and list them in PATCHES:\n" + "\n".join(sites))


def _private_overrides(module) -> list[str]:
    found = []
    for cls in vars(module).values():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        for name in vars(cls):
            if not name.startswith("_") or name.startswith("__"):
                continue
            for base in cls.__mro__[1:]:
                if base.__module__.split(".")[0] in UPSTREAM_PACKAGES and name in vars(base) \
                        and callable(inspect.getattr_static(base, name)):  # not traitlets' bookkeeping
                    found.append(f"{module.__name__}.{cls.__name__}.{name} overrides {base.__module__}."
                                 f"{base.__qualname__}.{name}")
                    break
    return found


def test_no_module_but_the_upstream_ones_overrides_a_private_upstream_method():
    modules = [importlib.import_module(".".join(p.relative_to(REPO).with_suffix("").parts)) for p in MODULES]
    found = [override for module in modules for override in _private_overrides(module)]
    assert not found, ("these override upstream's private methods outside the upstream modules: move them "
                       "there and list them in PATCHES:\n" + "\n".join(found))


def test_the_patch_homes_are_the_listed_ones():
    """Every patch names a file that exists; the session's upstream module lists kernelpipe.py's."""
    for patch in PATCHES:
        assert (REPO / patch.where.split(" ")[0]).exists(), patch
    assert any(p.where.startswith("portal/session/kernel/kernelpipe.py") for p in session_upstream.PATCHES)
    assert any(p.where == "portal/hub/proxy.js" for p in hub_upstream.PATCHES)


def test_a_changed_or_vanished_upstream_definition_names_the_patch_to_recheck():
    from portal.upstream.patchcheck import Definition, Mentions, Patch

    changed = Patch("example", "portal/hub/auth.py", "ldapauthenticator's get_connection",
                    "jupyterhub-ldapauthenticator", "0.1", "an example", (Definition("ldapauthenticator.ldapauthenticator",
                                                     "LDAPAuthenticator.get_connection", "0000000000000000"),
                                          Definition("ldapauthenticator.ldapauthenticator", "LDAPAuthenticator.gone",
                                                     "0000000000000000"),
                                          Mentions("jupyterhub.user", "no_such_name_anywhere", "0000000000000000")))
    [problem] = changed.problems()
    assert problem.startswith("patch 'example' (portal/hub/auth.py: ldapauthenticator's get_connection) was "
                              "written against jupyterhub-ldapauthenticator 0.1, installed is 2.0.2"), problem
    assert "LDAPAuthenticator.get_connection: sha256 " in problem
    assert "LDAPAuthenticator.gone is gone from ldapauthenticator.ldapauthenticator" in problem
    assert "jupyterhub.user no longer mentions no_such_name_anywhere" in problem


def test_an_upstream_function_edited_after_its_fingerprint_was_taken_fails_its_patch(tmp_path, monkeypatch):
    from portal.upstream.patchcheck import Definition, Patch

    module = tmp_path / "upstream_example.py"
    module.write_text("class Thing:\n    def _private(self):\n        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    taken = Definition("upstream_example", "Thing._private", "").current()
    patch = Patch("example", "portal/hub/auth.py", "upstream_example.Thing._private", "python", "3.11.2", "example",
                  (Definition("upstream_example", "Thing._private", taken),))
    assert patch.problems() == []
    module.write_text("class Thing:\n    def _private(self, now=True):\n        return 1\n")  # signature changed
    [problem] = patch.problems()
    assert "upstream_example:Thing._private: sha256 " in problem and f"not {taken}" in problem, problem


def test_a_version_of_the_code_the_patch_was_rechecked_against_passes_too(tmp_path, monkeypatch):
    """A distribution's security update of the same upstream version (Debian's python3.11 3.11.2-6+deb12u9 changed
    ssl.SSLObject._create, the deploy trial of 2026-12-06 found): re-checked, its fingerprint goes into ``also``."""
    from portal.upstream.patchcheck import Definition, Patch

    module = tmp_path / "upstream_example.py"
    module.write_text("class Thing:\n    def _private(self):\n        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = Definition("upstream_example", "Thing._private", "").current()
    module.write_text("class Thing:\n    def _private(self):\n        check()\n        return 1\n")
    updated = Definition("upstream_example", "Thing._private", "").current()
    patch = Patch("example", "portal/hub/auth.py", "upstream_example.Thing._private", "python", "3.11.2", "example",
                  (Definition("upstream_example", "Thing._private", first, also=(updated,)),))
    assert patch.problems() == []
    module.write_text("class Thing:\n    def _private(self):\n        return 2\n")  # neither of the two
    [problem] = patch.problems()
    assert f"not {first}" in problem, problem


@pytest.mark.parametrize("proxy_registered_first", [True, False])
def test_every_proxy_route_of_a_server_is_guarded(proxy_registered_first):
    """portguard.install, with jupyter-server-proxy's routes registered before it or after."""
    import logging
    from types import SimpleNamespace

    from jupyter_server_proxy.handlers import LocalProxyHandler, RemoteProxyHandler, setup_handlers
    from tornado.httputil import HTTPServerRequest
    from tornado.web import Application

    from portal.session.tool import portguard

    app = Application(base_url="/user/alice/")
    proxy_config = SimpleNamespace(host_allowlist=["localhost"], non_service_rewrite_response=())
    if proxy_registered_first:
        setup_handlers(app, proxy_config)
    portguard.install(app, "/user/alice/", logging.getLogger("test"))
    if not proxy_registered_first:
        setup_handlers(app, proxy_config)
    targets = [rule.target for router in (app.default_router, app.wildcard_router) for host_rule in router.rules
               for rule in getattr(host_rule.target, "rules", [])]
    proxies = [t for t in targets if isinstance(t, type) and issubclass(t, (LocalProxyHandler, RemoteProxyHandler))]
    first_four = proxies[:4]
    assert len(first_four) == 4 and all(t.__name__.startswith("OwnServices") for t in first_four), proxies
    connection = SimpleNamespace(set_close_callback=lambda callback: None, context=None)
    request = HTTPServerRequest("GET", "/user/alice/proxy/8888/", connection=connection)
    for guarded in first_four:
        assert guarded(app, request, absolute_url=False).host_allowlist is portguard.host_allowlist


def test_tensorboards_serve_without_an_info_file():
    from portal.session.tool.tensorboards import BoardProxyHandler

    board = session_upstream.tensorboard_without_info_file()
    assert "_register_info" in vars(board)
    assert {"http_get", "open", "post", "head", "_target"} <= set(vars(BoardProxyHandler))


def test_a_kernel_loads_the_job_launcher_only_when_a_cell_launches_a_job():
    """Every kernel of a session loads portal.session.job.magics; the rules, settings and Slurm client behind
    %%horovod load on first use (not paid for by every kernel start), and then work as before."""
    code = (
        "import sys, portal.session.job.magics as m\n"
        "heavy = ('portal.core.rules', 'portal.core.settings', 'pydantic', 'yaml')\n"
        "print(sorted(n for n in heavy if n in sys.modules and not type(sys.modules[n]).__name__ == '_LazyModule'))\n"
        "try:\n    m._parse('--nodes x')\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
        "print('pydantic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parent.parent)).stdout.splitlines()
    assert out[0] == "[]", out
    assert out[1] == "RequestError %%horovod: argument --nodes: invalid int value: 'x'"
    assert out[2] == "True"


# ------------------------------------------------------------------ failing closed as the hub or a session starts
CHANGED_UNDER = """
import dataclasses, sys
from portal.upstream import hub as hub_upstream
from portal.upstream import session as session_upstream
side, name = sys.argv[1], sys.argv[2]
patches = (hub_upstream if side == "hub" else session_upstream).PATCHES
index = next(i for i, p in enumerate(patches) if p.name == name)
first, *rest = patches[index].relies_on
patches[index] = dataclasses.replace(patches[index], relies_on=(dataclasses.replace(first, sha256="0" * 16), *rest))
if side == "hub":
    from traitlets.config import Config
    from portal.hub import config
    config.configure(Config(), settings=object())  # stops before it reads any setting
else:
    from portal.session import singleuser
    sys.argv = ["singleuser", sys.argv[3]]  # a server that exits at once
    singleuser.main()
    from portal.session.usage import activity
    from portal.upstream import session as upstream
    activity.count_only_changes_as_use()
    print("started; api-activity wrapped:", upstream._api_activity_wrapped())
"""


def _start_with_upstream_changed_under(side: str, patch: str, folder: Path) -> subprocess.CompletedProcess:
    server = folder / "server.py"
    server.write_text("")
    return subprocess.run([sys.executable, "-c", CHANGED_UNDER, side, patch, str(server)], capture_output=True,
                          text=True, timeout=120, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("side, patch, package", [("hub", "port-report-handler", "batchspawner"),
                                                  ("hub", "session-certificate-wait-up", "jupyterhub"),
                                                  ("session", "proxy-own-services", "jupyter-server-proxy"),
                                                  ("session", "kernel-private-pipe", "ipykernel")])
def test_a_security_patch_whose_upstream_changed_stops_the_start_in_one_line(side, patch, package, tmp_path):
    from importlib.metadata import version

    out = _start_with_upstream_changed_under(side, patch, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"dsportal: not starting: the security patch {patch!r} ("), line
    assert f"; the code it rests on changed in the installed {package} {version(package)} (" in line, line
    assert "started" not in out.stdout


def test_a_feature_patch_whose_upstream_changed_stands_aside_and_the_session_starts(tmp_path):
    out = _start_with_upstream_changed_under("session", "api-activity", tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("dsportal: standing aside: the patch 'api-activity' (portal/session/usage/activity.py) "
                               "was checked against jupyter_server 2.21.1"), lines
    assert lines[-1] == "started; api-activity wrapped: False", lines


# ------------------------------------------------------------------ a patch that does not guard truly stands aside
def test_every_patch_either_guards_or_is_one_that_stands_aside_in_code():
    """A patch whose upstream changed either stops the start (guards) or is left out where it is applied:
    its module asks stands_aside() (or, in a kernel, checks its fingerprints itself)."""
    standing_aside = {"paced-new-work": "portal/hub/pacing.py", "unshareable-share-refused": "portal/hub/sharing.py",
                      "proxy-restart-routes": "portal/hub/proxywatch.py",
                      "database-down-503": "portal/hub/databasedown.py",
                      "api-activity": "portal/upstream/session.py", "tensorboard-info-file": "portal/session/tool/tensorboards.py",
                      "kernel-launcher": "portal/session/kernel/specs.py",
                      "tensorboard-magic": "portal/session/job/magics.py"}
    assert sorted(p.name for p in PATCHES if not p.guards) == sorted(standing_aside)
    for name, home in standing_aside.items():
        text = (REPO / home).read_text()
        asks = f'stands_aside("{name}")' in text or f'p.name == "{name}").changed()' in text
        assert asks, f"{home} applies patch {name} whatever upstream became"


def test_standing_aside_the_kernel_launcher_is_ipykernels_own_and_tensorboards_say_they_are_off(tmp_path, monkeypatch):
    import asyncio

    from portal.session.kernel import specs as kernels
    from portal.session.tool import tensorboards
    from portal.upstream import patchcheck

    assert kernels.write_host_kernel(tmp_path / "on").startswith("python3")
    assert "portal.session.kernelstart" in (tmp_path / "on/kernels/python3/kernel.json").read_text()
    monkeypatch.setattr(patchcheck, "STANDING_ASIDE", {"kernel-launcher", "tensorboard-info-file"})
    assert kernels.write_host_kernel(tmp_path / "aside") is None  # the environment's own kernelspec serves
    (tmp_path / "runs").mkdir()
    boards = tensorboards.TensorBoards(str(tmp_path), "/user/alice/", str(tmp_path / "rt"))
    with pytest.raises(ValueError, match="TensorBoards are off in this session: the installed TensorBoard is a "
                                         "release this portal has not been checked against yet"):
        asyncio.run(boards.open("runs"))


def test_the_tensorboard_magic_stands_aside_where_tensorboard_changed(capsys):
    import dataclasses
    from types import SimpleNamespace

    from portal.session.job import magics

    upstream_start = object()
    notebook = SimpleNamespace(start=upstream_start)
    magics._start_session_tensorboard(notebook)
    assert notebook.start is magics.session_tensorboard
    index = next(i for i, p in enumerate(session_upstream.PATCHES) if p.name == "tensorboard-magic")
    patch = session_upstream.PATCHES[index]
    first, *rest = patch.relies_on
    changed = dataclasses.replace(patch, relies_on=(dataclasses.replace(first, sha256="0" * 16), *rest))
    session_upstream.PATCHES[index] = changed
    try:
        notebook = SimpleNamespace(start=upstream_start)
        magics._start_session_tensorboard(notebook)
    finally:
        session_upstream.PATCHES[index] = patch
    assert notebook.start is upstream_start
    assert "%tensorboard is TensorBoard's own here" in capsys.readouterr().err
