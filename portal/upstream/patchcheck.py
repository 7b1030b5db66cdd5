"""The record of a patch of upstream internals, and how an upgrade checks it.

dsportal replaces or wraps a few functions of JupyterHub, jupyter_server, ipykernel and friends,
overrides private methods and reads private attributes. Each such patch is a :class:`Patch` in
portal/upstream/hub.py or portal/upstream/session.py, with the upstream version it was written
against and fingerprints of the upstream code it rests on: the sha256 of a definition's source
(:class:`Definition`) or of every line that names something (:class:`Mentions`). The sources are
read from the installed files, not imported, so a patch already applied does not hide the original.
tests/test_upstream.py fails, naming the patch to re-check, when a fingerprint no longer matches.

The hub and every session check their patches as they start (:func:`check_at_start`): a security or
isolation patch (``guards``) whose upstream changed stops the start with one line that names it, so
that nothing runs unguarded; any other patch logs one line and stands aside (:func:`stands_aside`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHP = "configurable-http-proxy"  # sources "chp:<path in its package>", e.g. chp:lib/configproxy.js


def chp_folder() -> Path:
    """configurable-http-proxy's installed package (scripts/install-deps.sh: $DSPORTAL_PREFIX/chp)."""
    installed = Path(os.environ.get("DSPORTAL_PREFIX", "/opt/dsportal")) / "chp" / "node_modules" / CHP
    if installed.is_dir():
        return installed
    script = shutil.which(CHP)
    return Path(script).resolve().parent.parent if script else installed


def source_file(source: str) -> Path:
    """The installed file of a Python module (``jupyterhub.user``) or of CHP (``chp:lib/configproxy.js``).
    Found without importing anything (a session checks its patches before it loads upstream)."""
    if source.startswith("chp:"):
        return chp_folder() / source.removeprefix("chp:")
    top, _, rest = source.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.origin:
        raise LookupError(f"no Python source for module {source}")
    if not rest:
        found = [Path(spec.origin)]
    elif spec.submodule_search_locations:
        folder = Path(spec.submodule_search_locations[0], *rest.split("."))
        found = [folder.with_suffix(".py"), folder / "__init__.py"]
    else:
        found = []
    for path in found:
        if path.suffix == ".py" and path.is_file():
            return path
    raise LookupError(f"no Python source for module {source}")


def _read(path: Path) -> str:
    return _read_version(path, *_stamp(path))


def _parsed(path: Path) -> ast.Module:
    return _parse_version(path, *_stamp(path))


def _lines(path: Path) -> list[str]:
    return _lines_version(path, *_stamp(path))


def _segment(lines: list[str], node: ast.AST) -> str:
    """ast.get_source_segment(code, node), from the file's lines split once (it splits them per call)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_mtime_ns, status.st_size


# A patch's fingerprints mostly share one file: it is read and parsed once (per version of it).
@functools.lru_cache(maxsize=4)
def _read_version(path: Path, *stamp) -> str:
    return path.read_text()


@functools.lru_cache(maxsize=4)
def _parse_version(path: Path, *stamp) -> ast.Module:
    return ast.parse(_read_version(path, *stamp))


@functools.lru_cache(maxsize=4)
def _lines_version(path: Path, *stamp) -> list[str]:
    return LINE_ENDS.split(_read_version(path, *stamp))  # as the parser counts lines: \r\n, \r or \n


LINE_ENDS = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Definition:
    """The source of ``name`` (``function``, ``Class`` or ``Class.method``) in a Python module. ``also``: the
    fingerprints of other versions of that code the patch was re-checked against and holds with (a distribution's
    security update of the same upstream version, such as Debian's python3.11 3.11.2-6+deb12uN)."""

    source: str
    name: str
    sha256: str
    also: tuple[str, ...] = ()

    def text(self) -> str:
        path = source_file(self.source)
        nodes = _parsed(path).body
        node = None
        for part in self.name.split("."):
            node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         and n.name == part), None)
            if node is None:
                raise LookupError(f"{self.name} is gone from {self.source}")
            nodes = node.body
        return _segment(_lines(path), node)

    def current(self) -> str:
        return _digest(self.text())

    def __str__(self) -> str:
        return f"{self.source}:{self.name}"


@dataclass(frozen=True)
class Mentions:
    """Every line of a source file that names ``word``: each place upstream uses what is patched (``also``: as
    for :class:`Definition`)."""

    source: str
    word: str
    sha256: str
    also: tuple[str, ...] = ()

    def text(self) -> str:
        pattern = re.compile(rf"(?<![\w$]){re.escape(self.word)}(?![\w$])")
        lines = [line.strip() for line in _read(source_file(self.source)).splitlines() if pattern.search(line)]
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
    guards: bool = False  # security or isolation: nothing starts while its upstream code is unchecked
    hook: str = ""  # the public hook upstream would need to offer for this patch to go

    def installed_version(self) -> str:
        try:
            if self.package == "python":
                return platform.python_version()
            if self.package == CHP:
                return json.loads((chp_folder() / "package.json").read_text())["version"]
            return importlib.metadata.version(self.package)
        except (OSError, ValueError, KeyError, importlib.metadata.PackageNotFoundError):
            return "not installed"

    def changed(self) -> list[str]:
        """Each fingerprint that no longer matches, with how: empty where the upstream code is unchanged."""
        found = []
        for fingerprint in self.relies_on:
            try:
                now = fingerprint.current()
            except (LookupError, ImportError, OSError, SyntaxError) as error:
                now, why = None, str(error)
            if now != fingerprint.sha256 and now not in fingerprint.also:
                found.append(f"{fingerprint}: " + (why if now is None else f"sha256 {now}, not {fingerprint.sha256}"))
        return found

    def problems(self) -> list[str]:
        """What changed under this patch, one sentence each for the admin; empty: nothing did."""
        found = self.changed()
        if not found:
            return []
        return [f"patch {self.name!r} ({self.where}: {self.patches}) was written against {self.package} "
                f"{self.version}, installed is {self.installed_version()}, and the upstream code it rests on "
                f"changed: {'; '.join(found)}. Re-check the patch against the new code, then update its "
                "version and fingerprints (tests/test_upstream.py prints the new ones)."]

    def summary(self, changed: list[str]) -> str:
        """One line for the log: this patch, its upstream package, the versions, what changed."""
        return (f"patch {self.name!r} ({self.where.split(' ')[0]}) was checked against {self.package} "
                f"{self.version}; the code it rests on changed in the installed {self.package} "
                f"{self.installed_version()} ({', '.join(c.split(': ')[0] for c in changed)}); re-check it "
                "(docs/how-to/take-a-security-release.md)")


STANDING_ASIDE: set[str] = set()  # the names of this process's patches left out at start (stands_aside)


VERIFIED = Path(os.environ.get("DSPORTAL_PREFIX", "/opt/dsportal")) / "patchcheck-verified.json"


def _verified_key(patches: list[Patch]) -> str:
    """Every fingerprint expected, with the identity (device, inode, mtime, size) of each source file
    it is read from: what a full check at install time vouches for, without reading any source."""
    parts = []
    for patch in patches:
        for fingerprint in patch.relies_on:
            status = source_file(fingerprint.source).stat()
            parts.append(f"{fingerprint!s}={'|'.join((fingerprint.sha256, *fingerprint.also))}@{status.st_dev}:{status.st_ino}:"
                         f"{status.st_mtime_ns}:{status.st_size}")
    return _digest("\n".join(parts))


def record_verified(patches: list[Patch], path: Path = VERIFIED) -> bool:
    """At install time (root, after `make deps`): check every patch in full; if none changed, record
    the key of what was checked, so that starts skip reading and parsing upstream sources."""
    if any(patch.changed() for patch in patches):
        return False
    keys = json.loads(path.read_text()) if path.is_file() else []
    key = _verified_key(patches)
    path.write_text(json.dumps(sorted(set(keys) | {key})))
    return True


def _already_verified(patches: list[Patch], path: Path = VERIFIED) -> bool:
    try:
        return _verified_key(patches) in json.loads(path.read_text())
    except (OSError, ValueError, LookupError):
        return False


def check_at_start(patches: list[Patch], say: Callable[[str], None]) -> None:
    """As the hub or a session starts: a security or isolation patch whose upstream code changed
    stops the start (SystemExit, one line: the patch, the package, the versions), as it would
    otherwise run unguarded; any other such patch says one line and stands aside (:func:`stands_aside`)."""
    if _already_verified(patches):
        return
    try:
        for patch in patches:
            changed = patch.changed()
            if not changed:
                continue
            if patch.guards:
                raise SystemExit(f"dsportal: not starting: the security {patch.summary(changed)}")
            STANDING_ASIDE.add(patch.name)
            say(f"dsportal: standing aside: the {patch.summary(changed)}")
    finally:  # the sources are not needed again in this process
        for cached in (_read_version, _parse_version, _lines_version):
            cached.cache_clear()


def stands_aside(name: str) -> bool:
    """The patch ``name`` is left out: its upstream code changed (check_at_start said so in the log)."""
    return name in STANDING_ASIDE
