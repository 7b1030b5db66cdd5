"""The record of a patch of upstream internals, and how an upgrade checks it.

dsportal replaces or wraps a few functions of JupyterHub, jupyter_server, ipykernel and friends,
overrides private methods and reads private attributes. Each such patch is a :class:`Patch` in
portal/hub/upstream.py or portal/session/upstream.py, with the upstream version it was written
against and fingerprints of the upstream code it rests on: the sha256 of a definition's source
(:class:`Definition`) or of every line that names something (:class:`Mentions`). The sources are
read from the installed files, not imported, so a patch already applied does not hide the original.
tests/test_upstream.py fails, naming the patch to re-check, when a fingerprint no longer matches.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHP = "configurable-http-proxy"  # sources "chp:<path in its package>", e.g. chp:lib/configproxy.js


def chp_folder() -> Path:
    """configurable-http-proxy's installed package (scripts/install-deps.sh: $DSPORTAL_PREFIX/chp)."""
    installed = Path(os.environ.get("DSPORTAL_PREFIX", "/opt/dsportal")) / "chp" / "node_modules" / CHP
    if installed.is_dir():
        return installed
    script = shutil.which(CHP)
    return Path(script).resolve().parent.parent if script else installed


def source_file(source: str) -> Path:
    """The installed file of a Python module (``jupyterhub.user``) or of CHP (``chp:lib/configproxy.js``)."""
    if source.startswith("chp:"):
        return chp_folder() / source.removeprefix("chp:")
    spec = importlib.util.find_spec(source)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise LookupError(f"no Python source for module {source}")
    return Path(spec.origin)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Definition:
    """The source of ``name`` (``function``, ``Class`` or ``Class.method``) in a Python module."""

    source: str
    name: str
    sha256: str

    def text(self) -> str:
        code = source_file(self.source).read_text()
        nodes = ast.parse(code).body
        node = None
        for part in self.name.split("."):
            node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         and n.name == part), None)
            if node is None:
                raise LookupError(f"{self.name} is gone from {self.source}")
            nodes = node.body
        return ast.get_source_segment(code, node)

    def current(self) -> str:
        return _digest(self.text())

    def __str__(self) -> str:
        return f"{self.source}:{self.name}"


@dataclass(frozen=True)
class Mentions:
    """Every line of a source file that names ``word``: each place upstream uses what is patched."""

    source: str
    word: str
    sha256: str

    def text(self) -> str:
        pattern = re.compile(rf"(?<![\w$]){re.escape(self.word)}(?![\w$])")
        lines = [line.strip() for line in source_file(self.source).read_text().splitlines() if pattern.search(line)]
        if not lines:
            raise LookupError(f"{self.source} no longer mentions {self.word}")
        return "\n".join(lines)

    def current(self) -> str:
        return _digest(self.text())

    def __str__(self) -> str:
        return f"lines of {self.source} naming {self.word}"


@dataclass(frozen=True)
class Patch:
    """One patch of upstream internals: what it changes, why, and what it rests on."""

    name: str
    where: str  # the dsportal file(s) whose behaviour depends on it
    patches: str  # the upstream function, method or attribute replaced, wrapped, overridden or read
    package: str  # the distribution (pip's name), "python" or configurable-http-proxy
    version: str  # the version it was written against
    why: str
    relies_on: tuple[Definition | Mentions, ...]
    applied: Callable[[], bool] | None = None  # is it in place (after its module's callers ran)?

    def installed_version(self) -> str:
        if self.package == "python":
            return platform.python_version()
        if self.package == CHP:
            return json.loads((chp_folder() / "package.json").read_text())["version"]
        return importlib.metadata.version(self.package)

    def problems(self) -> list[str]:
        """What changed under this patch, one sentence each for the admin; empty: nothing did."""
        found = []
        for fingerprint in self.relies_on:
            try:
                now = fingerprint.current()
            except (LookupError, ImportError, OSError, SyntaxError) as error:
                now, why = None, str(error)
            if now != fingerprint.sha256:
                found.append(f"{fingerprint}: " + (why if now is None else f"sha256 {now}, not {fingerprint.sha256}"))
        if not found:
            return []
        return [f"patch {self.name!r} ({self.where}: {self.patches}) was written against {self.package} "
                f"{self.version}, installed is {self.installed_version()}, and the upstream code it rests on "
                f"changed: {'; '.join(found)}. Re-check the patch against the new code, then update its "
                "version and fingerprints (tests/test_upstream.py prints the new ones)."]
