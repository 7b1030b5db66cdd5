"""Regular expressions compiled once, at install, instead of at every session start.

A session's server compiles ~270 regular expressions while it starts (Tornado, jsonschema, email,
packaging, JupyterLab ...) and its first kernel ~120 more (IPython): ~6 % of either start's CPU,
the same patterns every time. Python keeps no compiled pattern across processes.

Here the installer (scripts/install-deps.sh, as root) compiles a list of those patterns with the
installed Python's own compiler (re's parser and code generator: nothing of it is copied) and writes
the results, per Python build, into the environment, next to the bytecode it also compiles:
``<prefix>/share/dsportal/compiled-patterns-<python build>.marshal``. A process that calls
:func:`use` then builds a pattern of that list from its compiled form (``_sre.compile``, as re does
last); any other pattern, or any pattern at all without a file for this exact Python (its version,
and the size and time of its re modules), is compiled as before. A stale list (a package upgraded since) costs only the compiling it no longer saves.

The list (``compiled-patterns.json`` beside this module) holds only patterns common to the starts
of two different users: nothing of one user's (her name, her URLs, her folders) is in it. To make
it again, run a session's server and a kernel of each of two users with DSPORTAL_RECORD_PATTERNS
naming a file of that user's, then ``python -m portal.compiledpatterns record
portal/compiled-patterns.json FILE1 FILE2``. The file is read only when it is not writable by group
or others and belongs to root, to the reader herself or to the environment's owner, whose
bytecode she runs anyway.

Standard library only, and only what re needs anyway (json on use): the session's server and its
kernels load it before anything else (singleuser, kernelstart).
"""

from __future__ import annotations

import marshal
import os
import re
import stat
import sys
from pathlib import Path

import _sre
from re import _casefix, _compiler, _constants, _parser

LIST = Path(__file__).with_name("compiled-patterns.json")  # [[pattern, flags], ...], bytes as {"bytes": latin-1 text}
RECORD = "DSPORTAL_RECORD_PATTERNS"  # a file: every pattern this process compiles is appended to it (record)
_real_compile = _compiler.compile
_compiled: dict = {}  # _key(pattern, flags) -> the arguments _sre.compile takes after the pattern
counts = {"from the install": 0, "compiled": 0}  # since use(): what the session's log reports


def cache_file(prefix: str = sys.prefix) -> Path:
    """Where this Python build's compiled patterns are: compiled code is only valid for the re
    engine that made it (its version, _sre.MAGIC and the size of its code words)."""
    build = f"{sys.implementation.cache_tag}-{sys.hexversion:x}-{_sre.MAGIC}-{_sre.CODESIZE}"
    return Path(prefix) / "share" / "dsportal" / f"compiled-patterns-{build}.marshal"


def compiled_form(pattern, flags: int) -> tuple:
    """What re's compiler hands _sre.compile for ``pattern``, after the pattern itself (as
    re._compiler.compile computes it)."""
    parsed = _parser.parse(pattern, flags)
    code = _compiler._code(parsed, flags)
    groupindex = parsed.state.groupdict
    indexgroup = [None] * parsed.state.groups
    for name, index in groupindex.items():
        indexgroup[index] = name
    return (int(flags | parsed.state.flags), [int(word) for word in code], parsed.state.groups - 1, dict(groupindex),
            tuple(indexgroup))


def _key(pattern, flags: int) -> tuple:
    """A pattern's key: its kind first, so that a str and a bytes pattern are never compared
    (their hashes can be equal)."""
    return (type(pattern) is bytes, pattern, flags)


def _compile(p, flags=0):
    """re._compiler.compile, from the compiled form when the pattern is one of the list's."""
    kind = type(p)  # only str and bytes themselves: not a subclass, nor a parsed pattern (re.Scanner)
    form = _compiled.get(_key(p, flags)) if kind is str or kind is bytes else None
    if form is None:
        counts["compiled"] += 1
        return _real_compile(p, flags)
    counts["from the install"] += 1
    return _sre.compile(p, *form)


def report() -> str:
    """How this process's regular expressions were made, in words (for its log)."""
    return f"{counts['from the install']} regular expressions compiled at install, {counts['compiled']} here"


def _trusted(info: os.stat_result) -> bool:
    """A file only root, the reader herself or the owner of this Python environment (whose
    bytecode she runs anyway) could have written."""
    try:
        environment_owner = os.stat(sys.prefix).st_uid
    except OSError:
        environment_owner = 0
    return stat.S_ISREG(info.st_mode) and info.st_uid in (0, os.geteuid(), environment_owner) \
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _compiler_files() -> list:
    """The size and modification time of the re modules that compile: an update of the system's
    Python that keeps its version number but changes how patterns compile makes the file stale."""
    return [[info.st_size, info.st_mtime_ns] for info in
            (os.stat(module.__file__) for module in (_parser, _compiler, _constants, _casefix))]


def use(path: Path | None = None) -> int:
    """Build the list's patterns from their compiled forms from now on in this process; how many
    it has (0: no file for this Python, one that cannot be trusted or is stale: all compiled as before)."""
    if os.environ.get(RECORD):
        _record(os.environ[RECORD])
        return 0
    path = path or cache_file()
    try:
        with open(path, "rb") as handle:
            if not _trusted(os.fstat(handle.fileno())):
                return 0
            written = marshal.loads(handle.read())  # one read: load() reads the file piece by piece
        if written["compiler"] != _compiler_files():
            return 0
        forms = dict(written["forms"])
    except Exception:  # noqa: BLE001 - unreadable, broken or of another shape: compiled as before
        return 0
    _compiled.update(forms)
    _compiler.compile = _compile
    return len(forms)


def build(patterns: list[tuple], path: Path | None = None) -> int:
    """Compile ``patterns`` ((pattern, flags) pairs) with this Python and write their compiled
    forms to ``path`` (mode 644, replaced whole); how many were written. A pattern this Python
    cannot compile is left out."""
    path = path or cache_file()
    forms = {}
    for pattern, flags in patterns:
        if flags & re.DEBUG:
            continue
        try:
            forms[_key(pattern, flags)] = compiled_form(pattern, flags)
        except (re.error, TypeError, ValueError, OverflowError, RecursionError):
            continue
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    for old in path.parent.glob("compiled-patterns-*.marshal"):  # an earlier Python build's
        if old != path:
            old.unlink()
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(marshal.dumps({"compiler": _compiler_files(), "forms": forms}))
    partial.chmod(0o644)
    partial.replace(path)
    return len(forms)


def listed_patterns(path: Path = LIST) -> list[tuple]:
    import json

    return [(_decoded(pattern), flags) for pattern, flags in json.loads(path.read_text())]


def _decoded(pattern):
    return pattern["bytes"].encode("latin-1") if isinstance(pattern, dict) else pattern


def _encoded(pattern):
    return {"bytes": pattern.decode("latin-1")} if isinstance(pattern, bytes) else pattern


# ------------------------------------------------------------------ recording the list (for developers)
def _record(file: str) -> None:
    """Append every pattern this process compiles to ``file``, one JSON line each."""
    import json

    def recording(p, flags=0):
        if isinstance(p, (str, bytes)) and not flags & re.DEBUG:
            with open(file, "a") as out:
                out.write(json.dumps([_encoded(p), int(flags)]) + "\n")
        return _real_compile(p, flags)

    _compiler.compile = recording


def common_patterns(*recordings: Path) -> list[tuple]:
    """The patterns every one of ``recordings`` holds (each from another user's start), in the
    first's order, once each."""
    import json

    seen = [[_entry(json.loads(line)) for line in r.read_text().splitlines()] for r in recordings]
    everywhere = set(seen[0]).intersection(*map(set, seen[1:]))
    kept, out = set(), []
    for key in seen[0]:
        if key in everywhere and key not in kept:
            kept.add(key)
            out.append(key)
    return out


def _entry(entry: list) -> tuple:
    pattern, flags = entry
    return (_decoded(pattern), flags)


def main(argv: list[str] | None = None) -> int:
    """``build [PREFIX]``: compile the list into PREFIX's environment (default: this Python's);
    ``record OUT RECORDING...``: write the patterns common to the recordings as the list OUT."""
    import json

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:
        target = cache_file(argv[1] if len(argv) > 1 else sys.prefix)
        count = build(listed_patterns(), target)
        print(f"compiled {count} regular expressions into {target}")
        return 0
    if argv[:1] == ["record"] and len(argv) >= 4:
        patterns = common_patterns(*map(Path, argv[2:]))
        Path(argv[1]).write_text("[\n" + ",\n".join(json.dumps([_encoded(p), f]) for p, f in patterns) + "\n]\n")
        print(f"{len(patterns)} patterns common to {len(argv) - 2} recordings -> {argv[1]}")
        return 0
    print(main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
