"""Files written whole or not at all: their readers (the Jobs panel, a job's log stream, JupyterLab's
kernel listing, the image catalogue) may read them at any moment, and a writer may be killed mid-way."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_whole(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> None:
    """Write ``data`` to a new file beside ``path``, then rename it over ``path`` (atomic on one file system)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        if isinstance(data, bytes):
            partial.write_bytes(data)
        else:
            partial.write_text(data)
        if mode is not None:
            os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
