"""The template sources a user sees: handed by the hub to each session (portal.core.sessionspec's ``templates``).

The spawner (hub) builds a :class:`Spec` from portal.yaml's ``templates`` section and the
user's groups; the session (portal/session/nbtemplates.py) publishes it, and the admin's
checks list the same notebooks.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

_SKIPPED = {".ipynb_checkpoints", "__pycache__"}


class TemplateError(ValueError):
    """A request about a template that cannot be served; the message is meant for the user."""


@dataclass
class Source:
    name: str
    path: str
    display_name: str = ""
    description: str = ""


@dataclass
class Spec:
    """What a session publishes: its folder names and the sources this user sees."""

    folder: str = "templates"
    copies: str = "notebooks"
    sources: list[Source] = field(default_factory=list)

    @classmethod
    def for_user(cls, templates: dict, groups: set[str]) -> Spec:
        """From portal.yaml's ``templates`` section, keeping the sources this user's groups see."""
        sources = [Source(name=s["name"], path=str(s["path"]), display_name=s.get("display_name") or "",
                          description=s.get("description") or "")
                   for s in templates.get("sources", []) if not s.get("groups") or groups & set(s["groups"])]
        return cls(folder=templates.get("folder", "templates"), copies=templates.get("copies", "notebooks"),
                   sources=sources)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Spec:
        return cls(folder=data["folder"], copies=data["copies"], sources=[Source(**s) for s in data["sources"]])

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise TemplateError(f"there is no template source {name!r} in your {self.folder}/ folder")


def files(folder: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIPPED)
        found += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return found


def notebooks(folder: Path) -> list[Path]:
    return [f for f in files(folder) if f.suffix == ".ipynb"]
