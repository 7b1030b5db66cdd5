"""Instructor template notebooks in every session.

The hub hands each session the template sources this user may see (portal.core.sessionspec's ``templates``:
the repo's notebooks, course folders of instructors). When the session's Jupyter server
starts, :func:`publish` makes ``~/templates/`` a read-only folder with one link per source,
so the file browser shows each source's *current* content: an instructor's update is visible
at once, and nobody but the folder's owner can write there (plain file permissions).

Opening a template gives the user a personal copy (``~/notebooks/<source>/...``, see
:meth:`Copies.open`) that is created once and never overwritten; when the template changed
after the copy was made, the answer says so and ``fresh`` makes a second copy beside it.
The JupyterLab extension calls this when a file under ``templates/`` is opened.

REST (under the session's base URL):
  GET  dsportal/api/templates        the sources, their files, and which have a copy of yours
  POST dsportal/api/templates/open   {"path": "templates/<source>/x.ipynb", "fresh": false}
                                     -> {"path": <what to open>, "created": bool, ...}
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from tornado import web

from portal.core import sessionspec
from portal.core.templatesources import Source, Spec, TemplateError, files
from portal.session.api import MessageAPIHandler

LEDGER = ".dsportal/template-copies.json"  # copy -> the template and its content when copied
_README = """# Templates

Notebooks from your instructors and the portal team, always their latest version.
This folder is read-only: **opening a notebook here gives you your own copy** in
`{copies}/<source>/`, which is yours to edit and run. Your copy is never replaced; when a
template changes after you copied it, opening it again tells you, and offers a fresh copy.

{sources}
"""


# ------------------------------------------------------------------ the read-only folder
def publish(root: Path, spec: Spec, log=None) -> Path:
    """Make ``root/<folder>`` the read-only view of the sources. Idempotent; never deletes
    anything of the user's (a file in the way is renamed, foreign entries are left alone)."""
    view = root / spec.folder
    if view.is_symlink() or (view.exists() and not view.is_dir()):
        aside = view.with_name(f"{spec.folder}.moved-{time.strftime('%Y%m%d-%H%M%S')}")
        view.rename(aside)
        if log:
            log.warning("dsportal: %s was in the way of the templates folder, moved to %s", view, aside)
    view.mkdir(exist_ok=True)
    os.chmod(view, 0o755)
    try:
        wanted = {s.name: s.path for s in spec.sources if Path(s.path).is_dir()}
        for source in spec.sources:
            if source.name not in wanted and log:
                log.warning("dsportal: template source %s (%s) is not a folder here", source.name, source.path)
        for entry in view.iterdir():
            if entry.is_symlink() and os.readlink(entry) != wanted.get(entry.name):
                entry.unlink()
        for name, target in wanted.items():
            link = view / name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target, target_is_directory=True)
        listing = "\n".join(f"- **{s.name}/**: {s.display_name or s.name}" + (f". {s.description}" if s.description
                                                                              else "")
                            for s in spec.sources if s.name in wanted)
        readme = view / "README.md"
        if not readme.is_symlink():
            readme.write_text(_README.format(copies=spec.copies, sources=listing or "No template sources yet."))
    finally:
        os.chmod(view, 0o555)
    return view


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ personal copies
class Copies:
    """The user's copies of templates, and the ledger of where each came from."""

    def __init__(self, root: Path, spec: Spec):
        self.root, self.spec = root, spec
        self.ledger_path = root / LEDGER

    def _ledger(self) -> dict:
        try:
            return json.loads(self.ledger_path.read_text())
        except (OSError, ValueError):
            return {}

    def _record(self, copy: str, template: str, digest: str) -> None:
        ledger = self._ledger()
        ledger[copy] = {"template": template, "sha256": digest, "copied_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True))
        tmp.replace(self.ledger_path)

    def template(self, path: str) -> tuple[Source, Path, str]:
        """``templates/<source>/<rest>`` -> (source, the file, its path below the source)."""
        parts = [p for p in str(path).strip("/").split("/") if p not in ("", ".")]
        if len(parts) < 3 or parts[0] != self.spec.folder:
            raise TemplateError(f"{path!r} is not a file in your {self.spec.folder}/ folder")
        if any(p == ".." or p.startswith(".") for p in parts):
            raise TemplateError(f"{path!r}: hidden names and '..' are not templates")
        source = self.spec.source(parts[1])
        base = Path(source.path).resolve()
        file = (base / Path(*parts[2:])).resolve()
        if base not in file.parents or not file.is_file():
            raise FileNotFoundError(f"{path} is not a template (any more?)")
        return source, file, "/".join(parts[2:])

    def copy_of(self, source: Source, rest: str) -> str:
        return f"{self.spec.copies}/{source.name}/{rest}"

    def _updated(self, copy: str, digest: str, ledger: dict | None = None) -> bool:
        """Has the template changed since ``copy`` was made from it (``digest``: its content's now)?"""
        entry = (ledger if ledger is not None else self._ledger()).get(copy)
        return bool(entry) and entry.get("sha256") != digest

    def open(self, path: str, fresh: bool = False) -> dict:
        """What to open for a template: the owner's own template, else the user's copy (made now
        if there is none, or a fresh one beside it when asked). An existing copy is never written."""
        source, template, rest = self.template(path)
        shown = f"{self.spec.folder}/{source.name}/{rest}"
        if os.access(template, os.W_OK):  # the instructor who owns the source edits it in place
            return {"path": shown, "template": shown, "created": False, "own_template": True,
                    "template_updated": False}
        copy = self.copy_of(source, rest)
        if fresh:
            stem, suffix = os.path.splitext(copy)
            number = 2
            while (self.root / f"{stem}-{number}{suffix}").exists():
                number += 1
            copy = f"{stem}-{number}{suffix}"
        target = self.root / copy
        content = template.read_bytes()
        digest = hashlib.sha256(content).hexdigest()
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(target, "xb") as handle:  # exclusive: an existing copy is never overwritten
                handle.write(content)
        except FileExistsError:
            return {"path": copy, "template": shown, "created": False, "own_template": False,
                    "template_updated": self._updated(copy, digest)}
        self._record(copy, shown, digest)
        return {"path": copy, "template": shown, "created": True, "own_template": False, "template_updated": False}

    def listing(self) -> dict:
        ledger = self._ledger()
        sources = []
        for source in self.spec.sources:
            folder = Path(source.path)
            listed = []
            for file in files(folder) if folder.is_dir() else []:
                rest = file.relative_to(folder).as_posix()
                copy = self.copy_of(source, rest)
                has_copy = (self.root / copy).exists()
                listed.append({"path": f"{self.spec.folder}/{source.name}/{rest}", "copy": copy if has_copy else None,
                              "template_updated": has_copy and self._updated(copy, _digest(file), ledger)})
            sources.append({**asdict(source), "available": folder.is_dir(), "files": listed})
        return {"folder": self.spec.folder, "copies": self.spec.copies, "sources": sources}


# ------------------------------------------------------------------ the server extension part
class _TemplatesAPI(MessageAPIHandler):
    @property
    def copies(self) -> Copies:
        return self.settings["dsportal_template_copies"]


class TemplatesHandler(_TemplatesAPI):
    @web.authenticated
    def get(self):
        self.finish(json.dumps(self.copies.listing()))


class OpenHandler(_TemplatesAPI):
    @web.authenticated
    def post(self):
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise web.HTTPError(400, 'expected {"path": "templates/<source>/<file>", "fresh": false}')
        try:
            answer = self.copies.open(body["path"], fresh=bool(body.get("fresh")))
        except TemplateError as error:
            raise web.HTTPError(400, str(error)) from None
        except FileNotFoundError as error:
            raise web.HTTPError(404, str(error)) from None
        except OSError as error:
            raise web.HTTPError(500, f"could not make your copy: {error.strerror or error}") from None
        self.set_status(201 if answer["created"] else 200)
        self.finish(json.dumps(answer))


def setup(server_app) -> list[tuple]:
    """Publish ~/templates; the API's routes, below the base URL (none without template sources)."""
    spec = sessionspec.templates()
    if spec is None:
        server_app.log.info("dsportal: no template sources for this session")
        return []
    root = Path(server_app.root_dir).expanduser()
    try:
        publish(root, spec, server_app.log)
    except OSError as error:  # a session without its templates still beats no session
        server_app.log.error("dsportal: could not publish templates in %s: %s", root, error)
    server_app.web_app.settings["dsportal_template_copies"] = Copies(root, spec)
    server_app.log.info("dsportal: templates of %s in %s/", ", ".join(s.name for s in spec.sources), spec.folder)
    return [("dsportal/api/templates", TemplatesHandler), ("dsportal/api/templates/open", OpenHandler)]
