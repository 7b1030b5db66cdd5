"""`dsportal hub move-database`: the hub's SQLite database moved to a server database, every row of
every JupyterHub table (users, API tokens, OAuth clients, servers, spawners with their state, which
are the running sessions, roles, groups, ...), with the hub stopped. The target gets the installed
JupyterHub's schema; on any failure it is left as it was found: without JupyterHub's tables."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path

from jupyterhub import orm
from sqlalchemy import Integer, create_engine, insert, inspect, select, text
from sqlalchemy.engine import Engine

from portal.admin.pidfiles import alive
from portal.core import hubdatabase, settings as settings_module
from portal.core.hubdatabase import DatabaseError

# SQLite's own bookkeeping and the schema version (the target is stamped with its own).
NOT_COPIED = {"sqlite_sequence", hubdatabase.ALEMBIC_TABLE}


@dataclass
class Moved:
    source: Path
    target: str
    counts: dict[str, int]
    revision: str


def move_database(settings, target_url: str, password_file: Path) -> Moved:
    source_path = Path(settings.hub.data_dir) / hubdatabase.SQLITE_NAME
    target_url = settings_module.database_url(target_url)
    if hubdatabase.is_sqlite(target_url):
        raise DatabaseError("the target is SQLite: move-database moves the hub to a database server")
    refuse_while_hub_runs(settings)
    source = open_source(source_path)
    target = hubdatabase.connect(target_url, password_file)
    try:
        counts = copy_into_empty(source, target)
    finally:
        source.dispose()
        target.dispose()
    return Moved(source_path, target_url, counts, hubdatabase.head_revision())


def refuse_while_hub_runs(settings) -> None:
    """A running hub writes its database all the time: a copy would miss what it writes next."""
    pidfile = Path(settings.hub.data_dir) / "jupyterhub.pid"
    pid = alive(pidfile)  # not a pid that came round to another program since the hub wrote it
    if pid:
        raise DatabaseError(f"the hub runs (pid {pid}, from {pidfile}): stop it first; running sessions "
                            "are Slurm jobs and keep running")
    if _hub_answers(settings.hub.bind_url):
        raise DatabaseError(f"a hub answers at {settings.hub.bind_url}: stop it first; running sessions "
                            "are Slurm jobs and keep running")


def _hub_answers(bind_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{bind_url.rstrip('/')}/hub/api", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def open_source(path: Path) -> Engine:
    """The SQLite file at the installed JupyterHub's schema version. Opened as the hub opens it, not
    read-only: after a kill -9 of the hub, SQLite replays the committed rows left in its write-ahead log."""
    if not path.is_file():
        raise DatabaseError(f"there is no SQLite hub database at {path}")
    source = create_engine(f"sqlite:///{path}", future=True)
    found, head = hubdatabase.schema_revision(source), hubdatabase.head_revision()
    if found != head:
        source.dispose()
        raise DatabaseError(f"{path} has JupyterHub's schema {found}, the installed JupyterHub writes {head}: "
                            "start the hub once on it (it upgrades its database), stop it, then move")
    unknown = set(inspect(source).get_table_names()) - set(orm.Base.metadata.tables) - NOT_COPIED
    if unknown:
        source.dispose()
        raise DatabaseError(f"{path} holds tables the installed JupyterHub does not know: {sorted(unknown)}")
    return source


def copy_into_empty(source: Engine, target: Engine) -> dict[str, int]:
    """Every JupyterHub table's rows, parents before children (foreign keys), in one transaction;
    the counts checked before it commits. Nothing of it stays on the target if anything fails."""
    present = hubdatabase.jupyterhub_tables(target)
    if present:
        raise DatabaseError(f"{target.url} already holds {len(present)} of JupyterHub's tables: "
                            "moving into it would mix two hubs; give an empty database")
    step = "creating JupyterHub's tables"
    try:
        hubdatabase.create_schema(target)
        tables = orm.Base.metadata.sorted_tables
        with source.connect() as reading, target.begin() as writing:
            expected = hubdatabase.count_rows(reading, tables)
            for table in tables:
                step = f"copying table {table.name}"
                rows = [dict(row) for row in reading.execute(select(table)).mappings()]
                if rows:
                    writing.execute(insert(table), rows)
            step = "checking the copy"
            _check_counts(writing, tables, expected)
            _advance_sequences(writing, tables)
    except Exception as error:
        # The driver's own message, without the SQL and its rows (tokens' hashes, spawners' state).
        cause = error if isinstance(error, DatabaseError) else getattr(error, "orig", None) or error
        raise DatabaseError(f"{step} failed, {_undo(target)}: {cause}") from error
    return expected


def _undo(target: Engine) -> str:
    """JupyterHub's tables dropped from the target again; says how that went."""
    try:
        hubdatabase.drop_schema(target)
    except Exception as error:  # noqa: BLE001 - whatever it was, the admin is told what is left to do
        return (f"and removing what it had made failed too ({getattr(error, 'orig', None) or error}): drop "
                f"every table of {target.url} by hand before trying again")
    return "and the target was left without JupyterHub's tables"


def _check_counts(connection, tables, expected: dict[str, int]) -> None:
    found = hubdatabase.count_rows(connection, tables)
    wrong = {name: (expected[name], found[name]) for name in expected if found[name] != expected[name]}
    if wrong:
        raise DatabaseError("rows went missing on the way (table: in SQLite, on the server): "
                            + ", ".join(f"{name}: {a}, {b}" for name, (a, b) in wrong.items()))


def _advance_sequences(connection, tables) -> None:
    """PostgreSQL hands out ids from sequences that rows inserted with their ids do not move: set each
    past the highest id copied, or the hub's next new user or token takes an id a copied row holds
    (tests/test_database_postgres.py). MySQL/MariaDB move AUTO_INCREMENT themselves."""
    if connection.dialect.name != "postgresql":
        return
    quote = connection.dialect.identifier_preparer.quote
    for table in tables:
        key = list(table.primary_key.columns)
        if len(key) != 1 or not isinstance(key[0].type, Integer):
            continue  # a composite or non-integer key has no sequence behind it
        connection.execute(
            text(f"SELECT setval(pg_get_serial_sequence(:table, :column), "
                 f"COALESCE((SELECT MAX({quote(key[0].name)}) FROM {quote(table.name)}), 0) + 1, false)"),
            {"table": quote(table.name), "column": key[0].name})
