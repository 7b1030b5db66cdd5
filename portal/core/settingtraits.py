"""The traits of the hub's classes (spawners, authenticator) that mirror portal.yaml's settings, made from the
settings' models.

A setting is declared once, in portal/core/settings.py (its type, default and description). JupyterHub configures its
classes through traitlets, so a class that needs a setting declares ``setting("session.activity_interval")``: a
trait of the setting's kind, with its default and its description, tagged with the setting's path; and the
hub's configuration hands every such trait its value from the loaded settings in one loop (:func:`hand_down`),
never a line a setting.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path

from pydantic import BaseModel
from traitlets import Float, Integer, TraitType, Unicode
from traitlets.config import Config

from portal.core.settings import LdapSettings, LoginThrottleSettings, SessionSettings, Settings, SlurmSettings

SECTIONS: dict[str, type[BaseModel]] = {"session": SessionSettings, "slurm": SlurmSettings, "ldap": LdapSettings,
                                        "ldap.throttle": LoginThrottleSettings}


def _field(path: str):
    section, key = path.rsplit(".", 1)
    return SECTIONS[section].model_fields[key]


def _as_trait_value(value):
    """A setting's value as the trait holds it: a path as text, no value as ''."""
    if value is None:
        return ""
    return str(value) if isinstance(value, Path) else value


def _trait_class(annotation) -> type[TraitType]:
    kinds = {typing.get_origin(annotation) or annotation}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = {a for a in typing.get_args(annotation) if a is not type(None)}
    if kinds <= {int}:
        return Integer
    if kinds <= {float, int}:
        return Float
    if kinds <= {str, Path, typing.Literal}:
        return Unicode
    raise TypeError(f"no trait for a setting of type {annotation!r}")


def setting(path: str) -> TraitType:
    """The trait for portal.yaml's ``path`` ("section.key"): its kind, default and description from the settings."""
    field = _field(path)
    trait = _trait_class(field.annotation)(_as_trait_value(field.get_default(call_default_factory=True)),
                                           help=f"portal.yaml's {path}: {field.description}")
    return trait.tag(config=True, setting=path)


def hand_down(c: Config, settings: Settings, *classes) -> None:
    """Each ``setting`` trait of ``classes`` configured from ``settings`` (portal/hub/config.py); a section the
    settings leave out (no ``ldap``) leaves its traits at their defaults."""
    for cls in classes:
        for name, trait in cls.class_traits(setting=lambda path: path is not None).items():
            *sections, key = trait.metadata["setting"].split(".")
            owner = settings
            for section in sections:
                owner = getattr(owner, section)
                if owner is None:
                    break
            else:
                setattr(getattr(c, cls.__name__), name, _as_trait_value(getattr(owner, key)))
