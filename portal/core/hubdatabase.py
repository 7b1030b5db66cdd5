"""The hub's database: SQLite in hub.data_dir (a single-machine trial), or a server database
(MariaDB/MySQL, PostgreSQL) named by hub.db_url, whose password is read from hub.db_password_file.

The password reaches the driver as a connection argument, never through the URL: JupyterHub hands
the URL to alembic, which writes it into a file and runs ``alembic`` as a command. So alembic never
connects on its own here: the schema is created, stamped and upgraded through this module's engine
(JupyterHub's own migration scripts), before JupyterHub checks the database's version.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import alembic.command
import alembic.config
from alembic.script import ScriptDirectory
from jupyterhub import dbutil, orm
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.engine import Engine

from portal.core import settings as settings_module

SQLITE_NAME = "jupyterhub.sqlite"
ALEMBIC_TABLE = "alembic_version"


class DatabaseError(RuntimeError):
    """The hub's database cannot be used or moved; the message says why and what to do."""


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir) / SQLITE_NAME}"


def hub_database_url(hub) -> str:
    """The URL JupyterHub gets: hub.db_url, else SQLite in hub.data_dir."""
    return hub.db_url or sqlite_url(hub.data_dir)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def read_password(path: Path) -> str:
    """The database password from its file, which other accounts must not be able to read."""
    try:
        return settings_module.read_secret(path, "the database password file")
    except settings_module.SettingsError as error:
        raise DatabaseError(str(error)) from None


def engine_arguments(url: str, password_file: Path | None) -> dict:
    """What JupyterHub passes to create_engine besides the URL (c.JupyterHub.db_kwargs)."""
    if is_sqlite(url):
        return {}
    arguments = {"connect_args": {"password": read_password(password_file)}}
    if url.startswith(("mysql", "mariadb")):
        arguments["pool_recycle"] = 60  # as JupyterHub does for mysql://: the server drops idle connections
    return arguments


def connect(url: str, password_file: Path | None) -> Engine:
    try:
        engine = create_engine(url, future=True, **engine_arguments(url, password_file))
        with engine.connect():
            pass
    except DatabaseError:
        raise
    except Exception as error:  # noqa: BLE001 - the driver's own errors: access denied, unknown database, no driver ...
        raise DatabaseError(f"cannot connect to the database {url}: {error}") from None
    return engine


def jupyterhub_tables(engine: Engine) -> set[str]:
    """JupyterHub's tables present in the database."""
    return set(inspect(engine).get_table_names()) & set(orm.Base.metadata.tables)


def head_revision() -> str:
    """The schema version of the installed JupyterHub."""
    return ScriptDirectory(dbutil.ALEMBIC_DIR).get_current_head()


def schema_revision(engine: Engine) -> str | None:
    if ALEMBIC_TABLE not in inspect(engine).get_table_names():
        return None
    with engine.connect() as connection:
        row = connection.execute(text(f"SELECT version_num FROM {ALEMBIC_TABLE}")).first()
    return row[0] if row else None


@contextmanager
def _alembic_through(engine: Engine):
    """JupyterHub's alembic configuration, connecting through ``engine`` (its env.py takes an engine
    from the config's attributes): the ini file it needs holds the URL without the password."""
    with tempfile.TemporaryDirectory() as folder:
        ini = os.path.join(folder, "alembic.ini")
        dbutil.write_alembic_ini(ini, engine.url.render_as_string(hide_password=True))
        config = alembic.config.Config(ini)
        config.attributes["connection"] = engine
        yield config


def create_schema(engine: Engine) -> None:
    """JupyterHub's tables as the installed JupyterHub makes them, stamped with its version."""
    if orm.mysql_large_prefix_check(engine):
        orm.add_row_format(orm.Base)  # what JupyterHub does for MySQL: long indexed columns fit
    orm.Base.metadata.create_all(engine)
    with _alembic_through(engine) as config:
        alembic.command.stamp(config, "head")


def drop_schema(engine: Engine) -> None:
    orm.Base.metadata.drop_all(engine)
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {ALEMBIC_TABLE}"))


def prepare(url: str, password_file: Path | None) -> None:
    """Before JupyterHub opens a server database: an empty one gets the installed JupyterHub's
    schema; one of an older JupyterHub is upgraded by JupyterHub's own migrations (take a backup
    first: the upgrade changes tables in place). SQLite is left to JupyterHub (upgrade_db backs it up)."""
    if is_sqlite(url):
        return
    engine = connect(url, password_file)
    try:
        if not jupyterhub_tables(engine):
            create_schema(engine)
            return
        found, head = schema_revision(engine), head_revision()
        if found is None:
            raise DatabaseError(f"the database {url} holds JupyterHub tables without a schema version: "
                                "it was made by a JupyterHub older than 0.8; upgrade it with that era's tools")
        if found != head:  # alembic logs each step into the hub's log
            with _alembic_through(engine) as config:
                alembic.command.upgrade(config, "head")
    finally:
        engine.dispose()


def count_rows(connection, tables) -> dict[str, int]:
    return {table.name: connection.execute(select(func.count()).select_from(table)).scalar_one() for table in tables}
