"""A session's start: its port report to the hub, its TLS with the hub, its garbage collector, and
changes made to a module once it is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent

AFTER_IMPORT = """
import importlib, importlib.util, sys
from portal.upstream.onuse import after_import
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


GARBAGE_COLLECTOR = """
import gc
from portal.session import singleuser
gc.disable()  # as singleuser.main, while the server loads
singleuser.started()  # the server serves (the session extension's start hook, or main's fallback timer)
print(gc.isenabled(), gc.get_freeze_count() > 0)
"""


def test_the_garbage_collector_runs_again_once_the_server_serves_over_what_it_makes_from_then_on():
    out = subprocess.run([sys.executable, "-c", GARBAGE_COLLECTOR], capture_output=True, text=True, timeout=60,
                         cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "True True", out.stdout


# The session's port report when its hub does not answer at first (a restart; connections refused
# while a class starts): it asks again, and ends its job in words if the hub never answers.
REPORT = """
import asyncio, json, logging, os, socket, sys
from tornado import web
from portal.core import sessionvars
from portal.session import portreport

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    hub_port = probe.getsockname()[1]
os.environ.update({"JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api", "JUPYTERHUB_API_TOKEN": "t",
                   "SLURM_JOB_ID": "42", sessionvars.REPORT_PORT: "1",
                   sessionvars.SESSION: json.dumps({"report_wait": float(sys.argv[1])})})
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


# The session's TLS context for its calls to the hub: the hub's CA bundle only, one per set of files.
TLS_CONTEXTS = """
import socket, ssl, sys, threading
from portal.upstream import session as upstream
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


def test_the_sessions_tls_to_its_hub_trusts_the_hubs_ca_only(tmp_path):
    _certificates(tmp_path)
    out = subprocess.run([sys.executable, "-c", TLS_CONTEXTS, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert out.returncode == 0, out.stderr
    [hub] = out.stdout.splitlines()
    assert hub.startswith("True 1 ok TLSv1.3 | refused "), hub  # one context, one CA; another CA's certificate refused


def test_a_session_whose_spec_is_not_the_hubs_does_not_start():
    """What the hub tells the session (portal.core.sessionspec, one variable) is validated as the session starts: one
    that does not validate (a key the hub never writes, a tool it does not know, a group name no group has)
    stops the start in one line, before any of the session runs on it."""
    for spec in ('{"idle_limit": -1}', '{"tools": {"offered": ["rstudio"]}}', '{"sharing_groups": ["a b"]}',
                 '{"run_as": "root"}', "not json"):
        out = subprocess.run([sys.executable, "-c", "from portal.session.singleuser import check_spec; check_spec()"],
                             capture_output=True, text=True, cwd=REPO, timeout=60,
                             env={**os.environ, "DSPORTAL_SESSION": spec})
        assert out.returncode == 1, (spec, out)
        assert out.stdout.startswith("dsportal: the session cannot start: DSPORTAL_SESSION is not a session spec of "
                                     "dsportal's hub: "), (spec, out.stdout)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPORTAL_")}
    missing = subprocess.run([sys.executable, "-c", "from portal.session.singleuser import check_spec; check_spec()"],
                             capture_output=True, text=True, cwd=REPO, timeout=60,
                             env={**env, "JUPYTERHUB_API_TOKEN": "a session's token"})  # a job, and no spec
    assert missing.returncode == 1 and "its job has no DSPORTAL_SESSION" in missing.stdout, missing
    fine = subprocess.run([sys.executable, "-c", "from portal.session.singleuser import check_spec; check_spec()"],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "DSPORTAL_SESSION": '{"idle_limit": 3600}'})
    assert fine.returncode == 0 and fine.stdout == "", fine
