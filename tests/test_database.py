"""The hub's database: a server database (MariaDB) with its password in a file of the hub's own,
the move of an SQLite hub there with its users, tokens and running sessions, and a kill -9 of the
hub on it. The first tests need no cluster; the others run on the demo (its MariaDB, its hub)."""

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pydantic import ValidationError
from traitlets.config import Config

import democluster as demo
from conftest import CONFIG, DSPORTAL, login
from democluster import hubdb
from hubclient import active_jobs
from portal.core import hubdatabase, settings as settings_module
from portal.hub.config import configure_database

MOVE_TEST_DATABASE, MOVE_TEST_ACCOUNT = "jupyterhub_movetest", "dsportal_movetest"


def hub_settings(**hub) -> settings_module.HubSettings:
    return settings_module.HubSettings.model_validate(hub)


def refusal(**hub) -> str:
    with pytest.raises(ValidationError) as error:
        hub_settings(**hub)
    return str(error.value)


def password_file(folder: Path, mode: int = 0o600) -> Path:
    path = folder / "db-password"
    path.write_text("s3cret-for-the-hub\n")
    path.chmod(mode)
    return path


# -- no cluster -------------------------------------------------------------------------------

@pytest.mark.quick
def test_without_db_url_the_hub_keeps_sqlite_in_its_data_folder(tmp_path):
    c = Config()
    configure_database(c, hub_settings(data_dir=str(tmp_path)))
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    assert c.JupyterHub.db_kwargs == {}
    assert c.JupyterHub.upgrade_db is True


@pytest.mark.quick
def test_a_server_database_url_names_no_password_and_comes_with_a_password_file(tmp_path):
    hub = hub_settings(db_url="mysql://dsportal_hub@127.0.0.1:3306/jupyterhub",
                       db_password_file=str(password_file(tmp_path)))
    assert hub.db_url == "mysql+pymysql://dsportal_hub@127.0.0.1:3306/jupyterhub"  # the driver dsportal installs
    assert "password" in refusal(db_url="mysql://hub:s3cret@db/jupyterhub", db_password_file="/etc/x")
    assert "db_password_file" in refusal(db_url="postgresql://hub@db/jupyterhub")
    assert "absolute path" in refusal(db_url="postgresql://hub@db/jupyterhub", db_password_file="db-password")
    assert "must name the account, the server and the database" in refusal(db_url="mariadb://db/",
                                                                          db_password_file="/etc/x")
    words = refusal(db_url="oracle://hub@db/jupyterhub", db_password_file="/etc/x")
    assert "is not a database URL dsportal knows" in words and "postgresql://" in words
    assert hub_settings(db_url="  ").db_url is None


@pytest.mark.quick
def test_the_password_reaches_the_driver_only_from_a_file_no_other_account_can_read(tmp_path):
    url = "mysql+pymysql://dsportal_hub@127.0.0.1:3306/jupyterhub"
    readable = password_file(tmp_path, 0o640)
    with pytest.raises(hubdatabase.DatabaseError, match=r"may be read by other accounts \(mode 0640\).*chmod 600"):
        hubdatabase.engine_arguments(url, readable)
    readable.chmod(0o600)
    assert hubdatabase.engine_arguments(url, readable)["connect_args"] == {"password": "s3cret-for-the-hub"}


@pytest.mark.quick
def test_a_hub_whose_database_server_does_not_answer_stops_with_a_message(tmp_path):
    hub = hub_settings(data_dir=str(tmp_path), db_url="mysql://dsportal_hub@127.0.0.1:9/jupyterhub",
                       db_password_file=str(password_file(tmp_path)))
    with pytest.raises(SystemExit) as stopped:
        configure_database(Config(), hub)
    assert "the hub's database: cannot connect to the database" in str(stopped.value)
    assert "s3cret" not in str(stopped.value)


# -- on the demo -------------------------------------------------------------------------------

@pytest.fixture
def server_database(portal, tmp_path):
    """An empty database and account of the test's own on the demo's MariaDB; dropped afterwards (tests
    ask for it before second_hub, so that the hubs on it are gone by then)."""
    secret = tmp_path / "movetest-password"
    secret.write_text(os.urandom(12).hex())
    secret.chmod(0o600)
    hubdb.create_database(hubdb.mariadb_socket(), MOVE_TEST_DATABASE, MOVE_TEST_ACCOUNT, secret.read_text())
    port = urlparse(settings_module.load(CONFIG).hub.db_url).port  # the demo's MariaDB
    yield f"mysql+pymysql://{MOVE_TEST_ACCOUNT}@127.0.0.1:{port}/{MOVE_TEST_DATABASE}", secret
    subprocess.run(["mariadb", f"--socket={hubdb.mariadb_socket()}"], check=True, text=True,
                   input=f"SET SESSION lock_wait_timeout = 60; DROP DATABASE IF EXISTS {MOVE_TEST_DATABASE}; "
                         f"DROP USER IF EXISTS '{MOVE_TEST_ACCOUNT}'@'127.0.0.1';")


def stop_second_hub(data_dir: Path) -> None:
    """SIGTERM, as systemd stops it: sessions are Slurm jobs and keep running."""
    pid = int((data_dir / "jupyterhub.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)


def wait_gone(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the hub (pid {pid}) did not exit")


def wait_checked(user) -> dict:
    """After a hub start it checks each recorded session before it answers for it."""
    deadline = time.monotonic() + 120
    while (model := user.model())["pending"] == "check" and time.monotonic() < deadline:
        time.sleep(0.5)
    return model


def sqlite_counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as connection:
        return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("users", "api_tokens", "oauth_clients", "spawners", "servers", "roles")}


def moved_counts(output: str) -> dict[str, int]:
    rows = [line.split() for line in output.splitlines() if line.startswith("  ")]
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}


def test_moving_an_sqlite_hub_to_the_server_database_keeps_users_tokens_and_running_sessions(
        server_database, second_hub, tmp_path):
    url, secret = server_database
    base = second_hub(lambda config: None)  # its own SQLite (conftest), as a hub before the move
    alice = login(base, "alice")
    alice.spawn()
    assert alice.token  # her API token, made now: it must work after the move
    jobs = [job["job_id"] for job in active_jobs("alice")]
    stop_second_hub(tmp_path / "hub")
    in_sqlite = sqlite_counts(tmp_path / "hub" / "jupyterhub.sqlite")
    assert in_sqlite["servers"] == 1 and in_sqlite["api_tokens"] >= 1

    moved = subprocess.run([DSPORTAL, "--config", str(tmp_path / "portal.yaml"), "hub", "move-database",
                            "--to", url, "--password-file", str(secret)], capture_output=True, text=True)
    assert moved.returncode == 0, moved.stderr
    print(moved.stdout)
    counts = moved_counts(moved.stdout)
    assert {table: counts[table] for table in in_sqlite} == in_sqlite

    base = second_hub(lambda config: config["hub"].update(db_url=url, db_password_file=str(secret)))
    assert wait_checked(alice)["servers"][""]["ready"], "alice's running session was lost in the move"
    assert [job["job_id"] for job in active_jobs("alice")] == jobs
    assert alice.api("GET", "/hub/api/user").json()["name"] == "alice"  # her token, from the server database
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    assert "moved" in alice.run_code("print('moved')")
    alice.stop_server()


def test_moving_into_a_database_that_already_holds_a_hub_is_refused_and_changes_nothing(
        server_database, second_hub, tmp_path):
    url, secret = server_database
    second_hub(lambda config: None)
    stop_second_hub(tmp_path / "hub")
    command = [DSPORTAL, "--config", str(tmp_path / "portal.yaml"), "hub", "move-database", "--to", url,
               "--password-file", str(secret)]
    assert subprocess.run(command, capture_output=True, text=True).returncode == 0
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 1
    assert "already holds" in again.stderr and "would mix two hubs" in again.stderr


def test_a_running_hub_is_not_moved(server_database, second_hub, tmp_path):
    url, secret = server_database
    second_hub(lambda config: None)
    moved = subprocess.run([DSPORTAL, "--config", str(tmp_path / "portal.yaml"), "hub", "move-database",
                            "--to", url, "--password-file", str(secret)], capture_output=True, text=True)
    assert moved.returncode == 1
    assert "the hub runs" in moved.stderr and "stop it first" in moved.stderr


def test_kill_9_of_the_hub_on_the_server_database_keeps_every_session(alice, bob, portal):
    db_url = settings_module.load(CONFIG).hub.db_url
    assert db_url and not db_url.startswith("sqlite"), "the demo's hub is meant to run on its MariaDB database"
    alice.spawn()
    bob.spawn()
    jobs = {user.name: [job["job_id"] for job in active_jobs(user.name)] for user in (alice, bob)}
    hub_pid = int(demo.hub_pidfile().read_text().split()[0])
    os.kill(hub_pid, signal.SIGKILL)
    wait_gone(hub_pid)
    demo.ensure_hub()
    for user in (alice, bob):
        assert wait_checked(user)["servers"][""]["ready"], f"{user.name}'s session was lost with the hub"
        assert [job["job_id"] for job in active_jobs(user.name)] == jobs[user.name]
        assert user.api("GET", f"/user/{user.name}/api/status").status_code == 200
        assert "still here" in user.run_code("print('still here')")
    # The killed hub's service (portal/hub/extend.py) went with it, and the new hub's took its port.
    more = alice.api("POST", "/user/alice/dsportal/api/extend", json={"minutes": 30})
    assert more.status_code == 200, more.text
