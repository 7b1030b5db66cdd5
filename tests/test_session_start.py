"""A session's entry point leaves hub-only code out of its start, and that code still works when used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What portal.session.singleuser does before it runs jupyterhub-singleuser, then: what was left out
# is not loaded, and each piece, used, is the real one.
SESSION_START = """
import sys
from portal.session import singleuser
singleuser.resolve_names_in_threads()
singleuser.call_the_hub_through_tornado()
singleuser.events_on_use()
singleuser.leave_out_the_hubs_database()
singleuser.semver_on_use()
singleuser.leave_out_the_pypi_extension_manager()
singleuser.skip_yarn_config()
import jupyterhub.singleuser, jupyterlab.labapp, portal.session.extension, jupyter_server_proxy.handlers
loaded = sorted(m for m in ("sqlalchemy", "alembic", "pydantic", "aiodns", "aiohttp.client", "IPython", "httpx",
                            "jupyterlab.extensions.pypi", "jupyter_builder.jupyterlab_semver", "jupyter_events", "yaml")
                if sys.modules.get(m) is not None)
print("loaded at start:", loaded)
import jupyterhub.orm, jupyterhub.roles, jupyterhub.scopes, requests
from portal.session import jobs_api
print(jupyterhub.orm.User.__tablename__, jupyterhub.scopes.sa.inspect.__name__,
      type(jupyterhub.roles.func.count).__name__, requests.Session.__name__, jobs_api.jobs.LaunchPolicy.__name__)
import jupyterhub.utils, aiohttp, jupyterlab.extensions
print(jupyterhub.utils.aiohttp.ClientOSError.__name__, jupyter_server_proxy.handlers.aiohttp.UnixConnector.__name__,
      aiohttp.ClientSession.__module__, type(jupyterlab.extensions.get_pypi_manager()).__module__)
import jupyterlab.commands
print(jupyterlab.commands._compare_ranges("^4.0.0", ">=4.1"), jupyterlab.commands.gte("4.6.0", "4.1.0", True))
# Events: jupyter_server's EventLogger drops what nothing listens to, loads jupyter_events for a listener
# (the events websocket), which then hears every event; a schema given twice raises the class the
# kernel manager catches.
import asyncio, jupyter_server.serverapp as serverapp, jupyter_server.services.kernels.kernelmanager as km
from jupyter_server.services.contents.manager import ContentsManager
logger = serverapp.EventLogger()
kernel_actions = km.ServerKernelManager().core_event_schema_paths[0]
logger.register_event_schema(kernel_actions)
logger.register_event_schema(kernel_actions)
event = {"action": "start", "kernel_id": "k1", "msg": "started", "status": "success"}
dropped = logger.emit(schema_id="https://events.jupyter.org/jupyter_server/kernel_actions/v1", data=event)
heard = []
async def listen():
    async def listener(logger, schema_id, data):
        heard.append(data["kernel_id"])
    logger.add_listener(schema_id="https://events.jupyter.org/jupyter_server/kernel_actions/v1", listener=listener)
    logger.emit(schema_id="https://events.jupyter.org/jupyter_server/kernel_actions/v1", data=event)
    await logger.gather_listeners()
asyncio.run(listen())
try:
    logger.register_event_schema(kernel_actions)
    raised = "nothing"
except km.SchemaRegistryException as error:
    raised = type(error).__name__
print(dropped, heard, raised, type(logger._real).__module__, isinstance(logger, ContentsManager.event_logger.klass))
"""


def test_hub_only_code_is_left_out_of_a_session_start_and_works_when_used():
    out = subprocess.run([sys.executable, "-c", SESSION_START], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "loaded at start: []", out.stdout
    assert lines[1] == "users inspect _FunctionGenerator Session LaunchPolicy", out.stdout
    assert lines[2] == "ClientOSError UnixConnector aiohttp.client jupyterlab.extensions.pypi", out.stdout
    assert lines[3] == "0 True", out.stdout  # JupyterLab's version checks, with the real semver module
    assert lines[4] == "None ['k1'] SchemaRegistryException jupyter_events.logger True", out.stdout


AFTER_IMPORT = """
import importlib, importlib.util, sys
from portal.session.onuse import after_import
seen = []
after_import("pkg_x.mod", lambda m: (seen.append(m.__name__), setattr(m, "start", lambda: "ours")))
print("pkg_x.mod" in sys.modules, importlib.util.find_spec("pkg_x.mod") is not None, "pkg_x.mod" in sys.modules, seen)
from pkg_x import mod
print(mod.start(), seen, type(mod.__loader__).__name__, type(mod.__spec__.loader).__name__)
importlib.import_module("pkg_x.mod")
after_import("pkg_x.mod", lambda m: seen.append("again"))
print(seen, any(type(f).__name__ == "AfterImport" for f in sys.meta_path))
"""


def test_a_change_made_after_import_waits_for_the_import_itself(tmp_path):
    """onuse.after_import (how a kernel patches TensorBoard's notebook module): nothing is loaded for
    it; a question that imports nothing (find_spec) leaves the change waiting; the import, from any
    importer, makes it once, the module keeping its real loader; on an imported module it is made
    at once."""
    (tmp_path / "pkg_x").mkdir()
    (tmp_path / "pkg_x" / "__init__.py").write_text("")
    (tmp_path / "pkg_x" / "mod.py").write_text("def start():\n    return 'theirs'\n")
    out = subprocess.run([sys.executable, "-c", AFTER_IMPORT], capture_output=True, text=True, timeout=60, cwd="/",
                         env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["False True False []",
                                       "ours ['pkg_x.mod'] SourceFileLoader SourceFileLoader",
                                       "['pkg_x.mod', 'again'] False"], out.stdout


EMPTY_COMMAND_LINE = """
import sys
from traitlets import Unicode
from traitlets.config import Application, Config, loader
from portal.session.upstream import nothing_to_parse_on_an_empty_command_line
built = []
real = loader.KVArgParseConfigLoader._create_parser
loader.KVArgParseConfigLoader._create_parser = lambda self, *a, **k: (built.append(1), real(self, *a, **k))[1]
class App(Application):
    name = Unicode("x").tag(config=True)
    aliases = {"name": "App.name"}
nothing_to_parse_on_an_empty_command_line()
nothing_to_parse_on_an_empty_command_line()
sys.argv = ["app"]
a = App(); a.parse_command_line(); print(len(built), a.argv, a.extra_args, a.name)
b = App(); b.parse_command_line(["--name=y", "extra"]); print(len(built), b.argv, b.extra_args, b.name)
sys.argv = ["app", "--name=z"]
c = App(); c.parse_command_line(); print(len(built), c.name)
d = App(config=Config({"App": {"name": "from-config"}})); d.parse_command_line([]); print(len(built), d.name)
"""


def test_an_empty_command_line_is_not_parsed_and_any_other_is():
    """A session's server starts without arguments: traitlets builds no argparse parser for them
    (it built 4, of every trait of every class, each start); arguments, from argv or sys.argv, are
    parsed as before, and config still applies."""
    out = subprocess.run([sys.executable, "-c", EMPTY_COMMAND_LINE], capture_output=True, text=True, timeout=60,
                         cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0 [] [] x", "1 ['--name=y', 'extra'] ['extra'] y", "2 z", "2 from-config"], out.stdout


ENTRY_POINTS_ONCE = """
import importlib.metadata as md
real = [sorted(ep.name for ep in md.entry_points(group=g)) for g in ("console_scripts", "jupyterlab.extension_manager_v1")]
reads = []
distributions = md.distributions
md.distributions = lambda **k: (reads.append(1), distributions(**k))[1]
from portal.session.upstream import read_entry_points_once_while_starting
read_entry_points_once_while_starting()
read_entry_points_once_while_starting()
from importlib.metadata import entry_points  # as JupyterLab and jupyter-server-proxy take it
starting = [sorted(ep.name for ep in entry_points(group=g)) for g in ("console_scripts", "jupyterlab.extension_manager_v1")]
print(len(reads), starting == real, len(real[0]) > 5, real[1])
import gc
from portal.session import singleuser
gc.disable()
singleuser.started()  # the server serves (the session extension's start hook, or main's fallback timer)
entry_points(group="console_scripts"); entry_points(group="console_scripts")
print(len(reads), gc.isenabled())
"""


def test_entry_points_are_read_once_while_the_server_starts_and_afresh_after():
    """While a session's server starts, every package's entry points are read once for all who ask
    (JupyterLab, jupyter-server-proxy), with the same answers; once it serves (singleuser.started,
    which also turns the garbage collector back on), each call reads them again (a package
    installed meanwhile is found)."""
    out = subprocess.run([sys.executable, "-c", ENTRY_POINTS_ONCE], capture_output=True, text=True, timeout=60,
                         cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("dsportal: serving")]
    assert lines == ["1 True True ['pypi', 'readonly']", "3 True"], out.stdout


# The session's hub client (portal.session.hubhttp, in jupyterhub.httpclient's place) against a real
# tornado server: what jupyterhub's session side sends and reads.
HUB_CLIENT = """
import asyncio, json
from tornado import web
from portal.session import hubhttp

class Elsewhere(web.RequestHandler):
    def get(self):
        self.redirect("http://198.51.100.250/steal-the-token")

class Api(web.RequestHandler):
    def get(self):
        self.set_header("X-JupyterHub-Version", "6.1.1")
        self.write({"seen": self.request.headers.get("Authorization")})
    def post(self):
        self.set_status(201 if self.request.body else 400)
        self.write({"body": self.request.body.decode(), "type": self.request.headers.get("Content-Type")})

async def main():
    server = web.Application([(r"/hub/api", Api), (r"/hub/api/elsewhere", Elsewhere)]).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    url = f"http://127.0.0.1:{port}/hub/api"
    got = await hubhttp.fetch(url, headers={"Authorization": "token t"})
    print(got.status, got.ok, got.headers.get("x-jupyterhub-version"), (await got.json())["seen"])
    posted = await hubhttp.fetch(url, method="post", data=json.dumps({"a": 1}),
                                 headers={"Content-Type": "application/json"})
    print(posted.status, await posted.text())
    empty = await hubhttp.fetch(url, method="POST", raise_for_status=False)
    print(empty.status, empty.ok)
    moved = await hubhttp.fetch(url + "/elsewhere", headers={"Authorization": "token t"}, raise_for_status=False)
    print(moved.status, moved.headers.get("Location"))
    for call in (hubhttp.fetch(url, method="POST"), hubhttp.fetch(url, timeout=3),
                 hubhttp.fetch(f"http://127.0.0.1:{port}/nothing-here".replace(str(port), "1"))):
        try:
            await call
        except Exception as error:
            print(type(error).__name__)
    server.stop()

asyncio.run(main())
"""


def test_the_sessions_hub_client_sends_and_reads_what_jupyterhub_uses_and_raises_when_unanswered():
    out = subprocess.run([sys.executable, "-c", HUB_CLIENT], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "200 True 6.1.1 token t",
        '201 {"body": "{\\"a\\": 1}", "type": "application/json"}',
        "400 False",
        "302 http://198.51.100.250/steal-the-token",  # not followed: the token goes to the hub only
        "HubResponseError",  # raise_for_status, as aiohttp's
        "TypeError",  # an option it does not support fails in words, not dropped
        "ConnectionRefusedError",  # nobody answers: raised, as aiohttp raises
    ], out.stdout


# The session's port report when its hub does not answer at first (a restart; connections refused
# while a class starts): it asks again, and ends its job in words if the hub never answers.
REPORT = """
import asyncio, json, logging, os, socket, sys
from tornado import web
from portal import sessionvars
from portal.session import portreport

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    hub_port = probe.getsockname()[1]
os.environ.update({"JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api", "JUPYTERHUB_API_TOKEN": "t",
                   "SLURM_JOB_ID": "42", sessionvars.REPORT_PORT: "1", sessionvars.REPORT_WAIT: sys.argv[1]})
logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)

class Server:  # what report() reads of the ServerApp
    port = 8888
    log = logging.getLogger("session")

class Report(web.RequestHandler):
    async def post(self):
        print("hub got", self.request.body.decode(), flush=True)
        await asyncio.sleep(float(sys.argv[3]))  # a hub slow to answer
        self.set_status(201)
        self.set_header("X-JupyterHub-Version", sys.argv[2])  # as every answer of JupyterHub's
        self.finish("{}")

async def main():
    hub = None
    async def hub_comes_up():
        nonlocal hub
        await asyncio.sleep(1.5)
        hub = web.Application([(r"/hub/api/batchspawner", Report)]).listen(hub_port, "127.0.0.1")
    up = asyncio.ensure_future(hub_comes_up())
    await portreport.report(Server())
    print("reported", flush=True)
    await up

asyncio.run(main())
"""


def _report(tries_for: float, hub_version: str | None = None, answers_after: float = 0.0):
    from jupyterhub import __version__

    return subprocess.run([sys.executable, "-c", REPORT, str(tries_for), hub_version or __version__, str(answers_after)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
                          cwd="/")


def test_a_session_asks_a_hub_that_does_not_answer_again_and_reports_once_it_does():
    out = _report(60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert 'hub got {"port": 8888, "job_id": "42"}' in lines, out.stdout
    assert lines[-2:] == ["dsportal: port 8888 reported to the hub", "reported"], out.stdout
    assert lines[0].startswith("dsportal: the hub did not take this session's port (599: ") and \
        "trying again in 0.5 s" in lines[0], out.stdout


def test_the_port_reports_answer_tells_a_session_of_another_hub_version_as_jupyterhub_singleuser_did():
    """The session asks the hub for nothing else as it starts (upstream.check_the_hub_once_serving):
    the report's answer carries the hub's version, checked as jupyterhub-singleuser checked its own."""
    from jupyterhub import __version__

    out = _report(60, hub_version="1.0.0")
    assert out.returncode == 0, out.stderr
    assert f"jupyterhub version 1.0.0 != jupyterhub-singleuser version {__version__}." in out.stdout, out.stdout
    assert "!=" not in _report(60).stdout


def test_a_session_whose_hub_never_answers_ends_its_job_in_words():
    out = _report(1)  # gives up before the hub comes up
    assert out.returncode == 1, out.stdout + out.stderr
    assert "hub got" not in out.stdout
    assert "dsportal: the hub did not answer this session's report for 1 s, the longest it waits for a session " \
        "to start (" in out.stderr, out.stderr
    assert out.stderr.strip().endswith("this job ends"), out.stderr


def test_a_session_waits_for_a_hub_slow_to_answer_and_reports_once():
    """The hub decides when a start failed: an answer that takes long (an overloaded hub) is waited
    for, not given up on, and not asked for twice."""
    out = _report(20, answers_after=6)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("hub got") == 1, out.stdout
    assert out.stdout.splitlines()[-2:] == ["dsportal: port 8888 reported to the hub", "reported"], out.stdout


# The session's TLS contexts: one for its calls to the hub, trusting the hub's CA bundle only;
# tornado's default client context loads the system's store when a connection first uses it.
TLS_CONTEXTS = """
import socket, ssl, sys, threading
from portal.session import upstream
folder = sys.argv[1]
context = upstream.hub_tls_context(f"{folder}/client.key", f"{folder}/client.crt", cafile=f"{folder}/ca.crt")
same = upstream.hub_tls_context(f"{folder}/client.key", f"{folder}/client.crt", cafile=f"{folder}/ca.crt")

def handshake(server_cert: str) -> str:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(f"{folder}/{server_cert}.crt", f"{folder}/{server_cert}.key")
    left, right = socket.socketpair()
    serving = threading.Thread(target=lambda: _serve(server, right))
    serving.start()
    try:
        with context.wrap_socket(left, server_hostname="hub.internal") as tls:
            return "ok " + tls.version()
    except ssl.SSLCertVerificationError as error:
        return "refused " + error.verify_message
    finally:
        serving.join(10)

def _serve(server, sock):
    try:
        server.wrap_socket(sock, server_side=True).close()
    except (ssl.SSLError, OSError):
        sock.close()

print(same is context, context.cert_store_stats()["x509_ca"], handshake("hub"), "|", handshake("public"))
upstream.system_store_on_first_use()
import tornado.iostream, tornado.netutil
default = tornado.iostream._client_ssl_defaults()
before = default.cert_store_stats()["x509_ca"]
default.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="example.org")
print(tornado.netutil._client_ssl_defaults() is default, before,
      default.cert_store_stats()["x509_ca"] == ssl.create_default_context().cert_store_stats()["x509_ca"] > 0,
      default.verify_mode == ssl.CERT_REQUIRED, default.check_hostname)
"""


def _certificates(folder: Path) -> None:
    """A CA (the hub's), a hub certificate and a client certificate from it, and a certificate for the
    same name from another CA (one a public CA could issue): real keys, made with openssl."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                "-subj", f"/CN={ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    for name, ca, host in (("hub", "ca", "hub.internal"), ("client", "ca", "session"), ("public", "other-ca", "hub.internal")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={host}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (folder / f"{name}.ext").write_text(f"subjectAltName=DNS:{host}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt")


def test_the_sessions_tls_to_its_hub_trusts_the_hubs_ca_only_and_tornado_loads_the_system_store_on_use(tmp_path):
    _certificates(tmp_path)
    out = subprocess.run([sys.executable, "-c", TLS_CONTEXTS, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert out.returncode == 0, out.stderr
    hub, tornado_default = out.stdout.splitlines()
    assert hub.startswith("True 1 ok TLSv1.3 | refused "), hub  # one context, one CA; another CA's certificate refused
    assert tornado_default == "True 0 True True True", tornado_default
