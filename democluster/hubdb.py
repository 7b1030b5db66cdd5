"""The demo hub's database: a database and an account of its own on the MariaDB the demo runs for
slurmdbd (accounting.py), when portal.yaml's hub.db_url names it. A hub that ran on SQLite until
then has its database moved there (portal/admin/dbmove.py), once, with the hub stopped."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from democluster.accounting import MARIADB_PORT
from democluster.base import DemoError, paths, run, say, secret_file
from democluster.hub import stop_hub
from portal.admin import dbmove
from portal.core import hubdatabase, settings as settings_module


def mariadb_socket() -> Path:
    return paths().root / "mariadb-run" / "mariadb.sock"


def ensure_hub_database(config_path: Path | None = None, socket: Path | None = None) -> None:
    """Idempotent: the database and account of hub.db_url (when it is the demo's MariaDB), its
    password in hub.db_password_file; then the hub's SQLite database moved in if it is still empty."""
    settings = settings_module.load(settings_module.config_path(config_path, demo=True))
    hub = settings.hub
    url = urlparse(hub.db_url or "")
    if not url.scheme.startswith(("mysql", "mariadb")) or url.port != MARIADB_PORT:
        return  # SQLite, or a database server that is not the demo's
    password = hub_password(hub.db_password_file, owner_of=Path(hub.data_dir))
    create_database(socket or mariadb_socket(), url.path.strip("/"), url.username, password)
    move_sqlite_in(settings)


def hub_password(path: Path, owner_of: Path) -> str:
    """The hub account's database password: made once (random), mode 0600, owned as the hub's
    data folder is, each time (the folder may have changed hands since: the hub's own account)."""
    secret_file(path, owner_of)
    try:
        return hubdatabase.read_password(path)
    except hubdatabase.DatabaseError as error:
        raise DemoError(str(error)) from None


def create_database(socket: Path, database: str, account: str, password: str) -> None:
    """The database (binary collation: names compare exactly, as in SQLite) and an account that may
    use it alone, from 127.0.0.1 (the hub connects over TCP). The SQL, with the password, goes
    to the mariadb client on its standard input, not its command line."""
    sql = (f"CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;\n"
           f"CREATE USER IF NOT EXISTS '{account}'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
           f"ALTER USER '{account}'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
           f"GRANT ALL ON `{database}`.* TO '{account}'@'127.0.0.1';\n")
    run(["mariadb", f"--socket={socket}"], input=sql)


def move_sqlite_in(settings) -> None:
    """The demo's earlier SQLite hub database, moved into the still empty server database: users,
    tokens and running sessions carry over. The SQLite file is kept, renamed, as a backup."""
    if not (Path(settings.hub.data_dir) / hubdatabase.SQLITE_NAME).exists():
        return
    try:
        if not server_database_is_empty(settings.hub):
            return
        stop_hub()  # sessions are Slurm jobs: they keep running; ensure_hub starts the hub again
        moved = dbmove.move_database(settings, settings.hub.db_url, settings.hub.db_password_file)
    except hubdatabase.DatabaseError as error:
        raise DemoError(f"moving the hub's SQLite database to MariaDB: {error}") from None
    # Renamed, so that a later `make demo` onto an emptied MariaDB does not bring back this old state.
    backup = moved.source.with_name(moved.source.name + ".moved")
    moved.source.rename(backup)
    say(f"hub database moved from SQLite to MariaDB ({moved.counts['users']} users, "
        f"{moved.counts['spawners']} spawners); the SQLite file is kept as {backup}")


def server_database_is_empty(hub) -> bool:
    target = hubdatabase.connect(hub.db_url, hub.db_password_file)
    try:
        return not hubdatabase.jupyterhub_tables(target)
    finally:
        target.dispose()
