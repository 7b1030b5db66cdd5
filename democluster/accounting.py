"""Slurm accounting on the demo: a private MariaDB, slurmdbd, and the QoS, accounts and users of users.yaml."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from democluster.base import (
    DemoError,
    alive,
    directory,
    paths,
    render,
    run,
    say,
    slurm_build,
    slurm_daemon,
    slurm_env,
    stop_pid,
    wait_for,
    write_if_changed,
)
from democluster.network import LOGIN_ADDRESS

# sacctmgr's words for an add that changed nothing: 22.05's, and 24.11's ("Already existing account", "Nothing added").
ALREADY_THERE = ("Nothing new added", "already exists", "Already existing", "Nothing added")
DBD_PORT, MARIADB_PORT = 17819, 17306  # slurmdbd (login node, reached by the compute nodes), MariaDB (127.0.0.1)


def ensure_accounting(fresh: bool = False) -> None:
    """Slurm accounting: a private MariaDB (127.0.0.1 only) and slurmdbd, so `sacct` keeps every job's
    final state and usage (GPU-hours) after slurmctld forgets it. ``fresh``: another Slurm release's
    accounting database goes first (slurmdbd converts only a release or two back)."""
    p = paths()
    # MariaDB runs as mysql: its socket, pid file and log live in a folder of its own.
    data_dir, run_dir = p.root / "mariadb", p.root / "mariadb-run"
    socket_path, pidfile = run_dir / "mariadb.sock", run_dir / "mariadb.pid"
    run_dir.mkdir(exist_ok=True)
    shutil.chown(run_dir, "mysql", "mysql")
    password_file = p.slurm / "dbd-password"
    if not password_file.exists():
        password_file.write_text(os.urandom(18).hex())
        os.chmod(password_file, 0o600)
    password = password_file.read_text().strip()
    if not (data_dir / "mysql").exists():
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        shutil.chown(data_dir, "mysql", "mysql")
        run(["mariadb-install-db", "--user=mysql", f"--datadir={data_dir}", "--auth-root-authentication-method=socket",
              "--skip-test-db"])
        say("MariaDB for Slurm accounting created")
    if not alive(pidfile):
        subprocess.Popen(
            ["/usr/sbin/mariadbd", "--user=mysql", f"--datadir={data_dir}", f"--socket={socket_path}",
             f"--port={MARIADB_PORT}", "--bind-address=127.0.0.1", f"--pid-file={pidfile}",
             f"--log-error={run_dir / 'mariadb.log'}", "--skip-name-resolve", "--innodb-buffer-pool-size=64M"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: socket_path.exists() and alive(pidfile), f"MariaDB (log: {run_dir / 'mariadb.log'})",
                  timeout=60)
        say(f"MariaDB started on 127.0.0.1:{MARIADB_PORT}")
    if fresh:
        stop_pid(p.run / "slurmdbd.pid", "slurmdbd")
        run(["mariadb", f"--socket={socket_path}"], input="DROP DATABASE IF EXISTS slurm_acct_db;")
        say("Slurm's accounting database of the other release dropped")
    sql = ("CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
           f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
    run(["mariadb", f"--socket={socket_path}"], input=sql)  # the password on its input, never a command line
    conf = render("slurmdbd.conf.j2", state=p.root, dbd_port=DBD_PORT, db_port=MARIADB_PORT, password=password,
                  login_address=LOGIN_ADDRESS, plugin_dir=slurm_build().get("plugin_dir", ""))
    changed = write_if_changed(p.slurm / "slurmdbd.conf", conf, 0o600)  # slurmdbd refuses a readable one: it holds the password
    env = slurm_env()
    if changed and alive(p.run / "slurmdbd.pid"):  # a changed conf (PrivateData, ...) holds once restarted
        stop_pid(p.run / "slurmdbd.pid", "slurmdbd")
    if not alive(p.run / "slurmdbd.pid"):
        run([slurm_daemon("slurmdbd")], env=env)
        wait_for(lambda: socket.create_connection(("127.0.0.1", DBD_PORT), timeout=1).close() or True,
                  "slurmdbd", timeout=60)
        say(f"slurmdbd started on 127.0.0.1:{DBD_PORT}")


def ensure_slurm_associations() -> None:
    """What slurm.conf's AccountingStorageEnforce asks for: the QoS with their limits and an
    association (account + user) for each demo user, from users.yaml. Idempotent."""
    env = slurm_env()
    data = directory()

    def sacctmgr(*args: str) -> None:
        result = subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True)
        if result.returncode != 0 and not any(word in result.stdout + result.stderr for word in ALREADY_THERE):
            raise DemoError(f"sacctmgr {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")

    for qos in data["slurm_qos"]:
        sacctmgr("add", "qos", qos["name"])
        # A limit on gres/gpu needs that TRES in the database, which slurmctld adds when it first
        # registers (AccountingStorageTRES): on a fresh machine that is a moment after it starts.
        limits = [f"MaxTRESPer{per}={qos[key]}" for per, key in (("User", "max_tres_per_user"), ("Job", "max_tres_per_job"))
                  if key in qos]
        wait_for(lambda qos=qos, limits=limits: sacctmgr("modify", "qos", "where", f"name={qos['name']}", "set",
                                                         f"Description={qos['description']}", *limits,
                                                         f"Flags={qos['flags']}") or True,
                  f"the limits of QoS {qos['name']}", timeout=60, interval=1)
    for account in data["slurm_accounts"]:
        users = ",".join(account["users"])
        sacctmgr("add", "account", account["name"], f"Description={account['description']}", "Organization=dsportal")
        sacctmgr("add", "user", users, f"Account={account['name']}")
        if account.get("qos"):
            sacctmgr("modify", "user", "where", f"name={users}", f"account={account['name']}", "set",
                     f"QOS={','.join(account['qos'])}", "DefaultQOS=normal")


def _mariadb_pidfile():
    return paths().root / "mariadb-run" / "mariadb.pid"


def stop_accounting() -> None:
    stop_pid(paths().run / "slurmdbd.pid", "slurmdbd")
    stop_pid(_mariadb_pidfile(), "MariaDB", wait=30)


def accounting_status() -> dict[str, bool]:
    return {"slurmdbd": bool(alive(paths().run / "slurmdbd.pid")), "MariaDB": bool(alive(_mariadb_pidfile()))}



def ensure_slurm_operator(account: str) -> None:
    """The hub's account as a Slurm operator: it sees every job (PrivateData hides them from users)."""
    env = slurm_env()
    for args in (["add", "account", "dsportal", "Description=the portal's hub", "Organization=dsportal"],
                 ["add", "user", account, "Account=dsportal", "AdminLevel=Operator"],
                 ["modify", "user", "where", f"name={account}", "set", "AdminLevel=Operator"]):
        result = subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True)
        if result.returncode != 0 and not any(word in result.stdout + result.stderr
                                              for word in (*ALREADY_THERE, "Nothing modified")):
            raise DemoError(f"sacctmgr {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")
