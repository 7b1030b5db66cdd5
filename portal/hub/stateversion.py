"""Which dsportal last ran a hub on its state, and no older one after it.

An upgrade moves the hub's state forward: JupyterHub migrates its database (alembic, forward only) and a
newer dsportal may write what an older one does not know. Started again on that state, an older dsportal
(a rollback of /opt/dsportal, a restore of an old environment beside a newer backup) would run on a
database it does not know, and JupyterHub says so late or not at all. So a hub older than the version
recorded in ``hub.data_dir/dsportal-version`` refuses to start, in words, and a hub records its own
version there once it has set up on that state (its database opened and migrated, its sessions
checked: after JupyterHub's init_tornado_application), not before: an upgraded hub that fails to
start leaves the version as it was, so going back to the release before it still works
(docs/how-to/take-a-security-release.md, docs/how-to/back-up-and-restore.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE = "dsportal-version"


class Downgrade(RuntimeError):
    """The state was last run by a newer dsportal than this one."""


def _parsed(version: str):
    from packaging.version import InvalidVersion, Version  # JupyterHub's own dependency

    try:
        return Version(version)
    except InvalidVersion:
        return None


def recorded(data_dir: Path) -> str | None:
    try:
        return (Path(data_dir) / FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def check_and_record(data_dir: Path, running: str) -> str | None:
    """check(), then record(): for a start that has nothing to set up in between."""
    before = check(data_dir, running)
    record(data_dir, running)
    return before


def check(data_dir: Path, running: str) -> str | None:
    """Refuse (Downgrade, in words) when ``data_dir`` records a newer dsportal than ``running``. Returns the
    version recorded (None at a first start). A version that is not one (a checkout run without being
    installed: "unknown") never refuses."""
    data_dir = Path(data_dir)
    before = recorded(data_dir)
    mine = _parsed(running)
    if mine is None:
        return before
    theirs = _parsed(before) if before else None
    if theirs is not None and theirs > mine:
        raise Downgrade(
            f"{data_dir / FILE} says dsportal {before} last ran this hub; this is dsportal {running}, older. "
            f"It would run on a database and state that {before} may have changed (JupyterHub migrates its "
            f"database forward only), so it does not start. Install dsportal {before} or newer "
            "(docs/how-to/take-a-security-release.md), or restore the backup taken before the upgrade "
            "(docs/how-to/back-up-and-restore.md) together with the dsportal that wrote it.")
    return before


def record(data_dir: Path, running: str) -> None:
    """``running`` as the dsportal that last ran on ``data_dir`` (a version that is not one is not recorded)."""
    data_dir = Path(data_dir)
    if _parsed(running) is not None and recorded(data_dir) != running:
        with tempfile.NamedTemporaryFile("w", dir=data_dir, prefix=f".{FILE}.", delete=False) as handle:
            handle.write(f"{running}\n")
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, data_dir / FILE)
