"""The hub on PostgreSQL: an SQLite hub moved there keeps its users, tokens and running sessions,
new rows after the move get new ids, and JupyterHub's own `upgrade-db` runs against it.

Nothing here touches the demo: the tests run a PostgreSQL cluster of their own (port 17432,
127.0.0.1 only, data in /var/lib/dsportal-pgtest), made on first use, with a database and account
per test, and throwaway JupyterHubs on loopback ports of their own (1809x), whose sessions are small
local processes. The hubs take their database settings from dsportal (portal/hub/config.py)."""

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from jupyterhub import dbutil
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from conftest import CONFIG, REPO
from portal.core import hubdatabase, settings as settings_module

PG_VERSION, PG_CLUSTER, PG_PORT = "15", "dsportal-pgtest", 17432
PG_DATA = Path("/var/lib/dsportal-pgtest")
PG_CONF = Path(f"/etc/postgresql/{PG_VERSION}/{PG_CLUSTER}")
PROXY_PORT, HUB_PORT, PROXY_API_PORT = 18090, 18091, 18092
HUB_URL = f"http://127.0.0.1:{PROXY_PORT}"
ADMIN_TOKEN = secrets.token_hex(16)  # a service of the test's own, with the admin role
OLDER_REVISION = "4621fec11365"  # JupyterHub 3.x's schema: the upgrade runs every migration since
CHP = Path(sys.executable).parents[2] / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"

SESSION = '''"""A stand-in session: answers every GET with its user's name and the pid that serves it."""
import http.server, os, urllib.parse
from pathlib import Path

url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
Path(os.environ["SCRATCH_SESSIONS"], str(os.getpid())).touch()  # the test ends it afterwards


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"session of {os.environ['JUPYTERHUB_USER']}, pid {os.getpid()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer((url.hostname, url.port), Answer).serve_forever()
'''

HUB_CONFIG = '''from jupyterhub.spawner import LocalProcessSpawner
from portal.core import settings as settings_module
from portal.hub.config import configure_database


class ScratchSpawner(LocalProcessSpawner):
    """Sessions as processes of the hub's own account: the test's users are not local accounts."""

    def make_preexec_fn(self, name):
        return None

    def user_env(self, env):
        return env


c.JupyterHub.ip, c.JupyterHub.port = "127.0.0.1", {proxy_port}
c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.cookie_secret_file = {data!r} + "/cookie_secret"
c.JupyterHub.pid_file = {data!r} + "/jupyterhub.pid"
c.JupyterHub.cleanup_servers = False  # sessions outlive the hub, as dsportal's Slurm jobs do
c.JupyterHub.spawner_class = ScratchSpawner
c.Spawner.cmd = [{python!r}, {session!r}]
c.Spawner.environment = {{"SCRATCH_SESSIONS": {sessions!r}}}
c.JupyterHub.services = [{{"name": "test-admin", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["test-admin"]}}]
configure_database(c, settings_module.HubSettings.model_validate({hub!r}))
'''


# -- PostgreSQL: a cluster of the tests' own ----------------------------------------------------

def as_postgres(command: list[str], sql: str | None = None) -> str:
    """A PostgreSQL tool as the postgres account; SQL (with passwords) on its standard input."""
    done = subprocess.run(["runuser", "-u", "postgres", "--", *command], input=sql, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed: {done.stderr}"
    return done.stdout


def psql(sql: str) -> str:
    return as_postgres(["psql", "-v", "ON_ERROR_STOP=1", "-q", "-X", "-At", "-p", str(PG_PORT), "-d", "postgres"], sql)


def ensure_cluster() -> None:
    """Idempotent: the cluster made (listening on 127.0.0.1 only, password logins over TCP), and running."""
    if PG_CLUSTER not in subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout:
        subprocess.run(["pg_createcluster", PG_VERSION, PG_CLUSTER, "--port", str(PG_PORT), "--datadir", str(PG_DATA),
                        "--start-conf", "manual", "--encoding", "UTF8", "--locale", "C.UTF-8"],
                       check=True, capture_output=True)
        # A file of its own in conf.d: pg_createcluster -o and pg_conftool write 127.0.0.1 unquoted, which
        # PostgreSQL cannot parse.
        (PG_CONF / "conf.d" / "dsportal-pgtest.conf").write_text("listen_addresses = '127.0.0.1'\n")
    status = subprocess.run(["pg_lsclusters", "-h", PG_VERSION, PG_CLUSTER], capture_output=True, text=True).stdout
    if "online" not in status:
        subprocess.run(["pg_ctlcluster", PG_VERSION, PG_CLUSTER, "start"], check=True)


@pytest.fixture(scope="module")
def postgres():
    ensure_cluster()
    return PG_PORT


@pytest.fixture
def hub_database(postgres, tmp_path):
    """An empty database and an account that owns it, its password in a 0600 file; dropped afterwards."""
    name = f"hubtest_{secrets.token_hex(4)}"
    secret = tmp_path / "db-password"
    secret.write_text(secrets.token_hex(16))
    secret.chmod(0o600)
    psql(f"CREATE ROLE {name} LOGIN PASSWORD '{secret.read_text()}';\nCREATE DATABASE {name} OWNER {name};\n")
    yield f"postgresql://{name}@127.0.0.1:{postgres}/{name}", secret
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);\nDROP ROLE IF EXISTS {name};\n")


def pgpass_for(url: str, secret: Path, folder: Path) -> Path:
    """libpq's password file: how JupyterHub's own upgrade-db (alembic, run as a command) gets the
    password without it in the URL."""
    parsed = make_url(url)
    path = folder / "pgpass"
    path.write_text(f"{parsed.host}:{parsed.port}:{parsed.database}:{parsed.username}:{secret.read_text()}\n")
    path.chmod(0o600)
    return path


# -- throwaway JupyterHubs ------------------------------------------------------------------------

@pytest.fixture
def scratch_hub(tmp_path):
    """Starts a JupyterHub on SQLite in tmp_path/hub or on the database given; stops them all and
    ends their sessions afterwards."""
    data, sessions = tmp_path / "hub", tmp_path / "sessions"
    data.mkdir(mode=0o700)
    sessions.mkdir()
    (tmp_path / "session.py").write_text(SESSION)
    processes = []

    def start(db_url: str | None = None, password_file: Path | None = None) -> subprocess.Popen:
        hub = {"data_dir": str(data), "db_url": db_url, "db_password_file": str(password_file) if password_file else None}
        config = tmp_path / "jupyterhub_config.py"
        config.write_text(HUB_CONFIG.format(
            proxy_port=PROXY_PORT, hub_port=HUB_PORT, proxy_api_port=PROXY_API_PORT, chp=str(CHP), data=str(data),
            python=sys.executable, session=str(tmp_path / "session.py"), sessions=str(sessions), token=ADMIN_TOKEN,
            hub=hub))
        assert not answers(), f"something left from an earlier run answers at {HUB_URL}: stop it first"
        with open(tmp_path / "hub.log", "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=data,
                                       stdout=log, stderr=subprocess.STDOUT, env=environment())
        processes.append(process)
        wait_answers(process, tmp_path / "hub.log")
        return process

    yield start
    for process in processes:
        stop(process)
    for pid_file in sessions.iterdir():
        try:
            os.kill(int(pid_file.name), signal.SIGTERM)
        except ProcessLookupError:
            pass


def environment(**more) -> dict:
    """This checkout's dsportal first on the path, the environment's commands (alembic) found."""
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "PATH": path, **more}


def answers() -> bool:
    try:
        return requests.get(f"{HUB_URL}/hub/api", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def wait_answers(process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the scratch hub exited:\n{log.read_text()}"
        if answers():
            return
        time.sleep(0.3)
    raise AssertionError(f"the scratch hub did not answer in 60 s:\n{log.read_text()}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, as systemd stops a hub: its sessions keep running (cleanup_servers is off)."""
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


def api(method: str, path: str, token: str = ADMIN_TOKEN, **body) -> requests.Response:
    return requests.request(method, f"{HUB_URL}/hub/api{path}", headers={"Authorization": f"token {token}"},
                            json=body or None, timeout=10)


def wait_ready(name: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        model = api("GET", f"/users/{name}").json()
        if model["servers"].get("", {}).get("ready"):
            return model
        time.sleep(0.3)
    raise AssertionError(f"{name}'s server did not become ready: {model}")


def spawner_states(rows) -> dict[str, dict]:
    """name: the spawner's state (the session's pid here, the Slurm job in dsportal)."""
    return {name: json.loads(state or "{}") for name, state in rows}


SPAWNER_STATES = "SELECT users.name, spawners.state FROM spawners JOIN users ON users.id = spawners.user_id"


# -- the tests ------------------------------------------------------------------------------------------

def test_a_postgresql_url_gets_the_psycopg_driver_dsportal_installs():
    url = settings_module.database_url("postgresql://dsportal_hub@db.example.org/jupyterhub")
    assert url == "postgresql+psycopg://dsportal_hub@db.example.org/jupyterhub"
    assert settings_module.database_url("postgresql+psycopg2://hub@db/jupyterhub").startswith("postgresql+psycopg2://")


def test_moving_an_sqlite_hub_to_postgresql_keeps_users_tokens_and_running_sessions(
        hub_database, scratch_hub, tmp_path):
    url, secret = hub_database
    sqlite_hub = scratch_hub()
    for name in ("alice", "bob"):
        assert api("POST", f"/users/{name}").status_code == 201
    alice_token = api("POST", "/users/alice/tokens", note="minted on SQLite").json()["token"]
    assert api("POST", "/users/alice/server").status_code in (201, 202)
    wait_ready("alice")
    before = requests.get(f"{HUB_URL}/user/alice/", timeout=10).text
    assert before.startswith("session of alice")
    stop(sqlite_hub)
    with sqlite3.connect(tmp_path / "hub" / "jupyterhub.sqlite") as connection:
        states_in_sqlite = spawner_states(connection.execute(SPAWNER_STATES))

    moved = move_to(url, secret, tmp_path)
    assert moved.returncode == 0, moved.stderr
    print(moved.stdout)

    scratch_hub(url, secret)
    assert wait_ready("alice")["servers"][""]["ready"], "alice's running session was lost in the move"
    assert requests.get(f"{HUB_URL}/user/alice/", timeout=10).text == before, "not the same session process"
    assert api("GET", "/user", token=alice_token).json()["name"] == "alice"  # her token, from PostgreSQL
    # New rows after rows copied with their ids: PostgreSQL's sequences were moved past them.
    assert api("POST", "/users/carol").status_code == 201
    second_token = api("POST", "/users/alice/tokens", note="minted on PostgreSQL").json()["token"]
    assert api("GET", "/user", token=second_token).json()["name"] == "alice"
    assert sorted(user["name"] for user in api("GET", "/users").json()) == ["alice", "bob", "carol"]
    engine = hubdatabase.connect(settings_module.database_url(url), secret)
    try:
        with engine.connect() as connection:
            states = spawner_states(connection.exec_driver_sql(SPAWNER_STATES))
    finally:
        engine.dispose()
    assert states["alice"] == states_in_sqlite["alice"] and states["alice"]["pid"]


def move_to(url: str, secret: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`dsportal hub move-database` on a portal.yaml whose hub is the scratch hub."""
    config = yaml.safe_load(CONFIG.read_text())
    config["hub"].update(data_dir=str(tmp_path / "hub"), bind_url=HUB_URL, db_url=None, db_password_file=None)
    portal_yaml = tmp_path / "portal.yaml"
    portal_yaml.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "portal.cli", "--config", str(portal_yaml), "hub", "move-database",
                           "--to", url, "--password-file", str(secret)], capture_output=True, text=True,
                          env=environment(), cwd=tmp_path)


def test_jupyterhubs_own_upgrade_db_and_the_hubs_start_upgrade_a_postgresql_database(hub_database, tmp_path):
    url, secret = hub_database
    url = settings_module.database_url(url)
    pgpass = pgpass_for(url, secret, tmp_path)
    hubdatabase.prepare(url, secret)  # an empty database gets the installed JupyterHub's schema
    head = hubdatabase.head_revision()

    def alembic_to_older() -> None:
        with dbutil._temp_alembic_ini(url) as ini:
            subprocess.run(["alembic", "-c", ini, "downgrade", OLDER_REVISION], check=True, capture_output=True,
                           env=environment(PGPASSFILE=str(pgpass)))

    alembic_to_older()
    upgraded = subprocess.run([sys.executable, "-m", "jupyterhub", "upgrade-db", f"--db={url}"], cwd=tmp_path,
                              capture_output=True, text=True, env=environment(PGPASSFILE=str(pgpass)))
    assert upgraded.returncode == 0, upgraded.stderr
    engine = hubdatabase.connect(url, secret)
    try:
        assert hubdatabase.schema_revision(engine) == head
        assert "display_name" in {column["name"] for column in inspect(engine).get_columns("spawners")}
        alembic_to_older()  # and again, upgraded as a dsportal hub does at its start
        assert hubdatabase.schema_revision(engine) == OLDER_REVISION
        hubdatabase.prepare(url, secret)
        assert hubdatabase.schema_revision(engine) == head
    finally:
        engine.dispose()
