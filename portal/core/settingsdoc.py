"""The portal.yaml reference, written from the settings model: each key's type, default and description
come from portal/core/settings.py, their one home. `dsportal docs portal-yaml` prints it;
docs/reference/portal-yaml.md is its output, and tests/test_docs.py fails when that file is stale."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from portal.core.settings import RENAMED, Settings

TARGET = "docs/reference/portal-yaml.md"

_INTRO = """\
# portal.yaml reference

<!-- Written by `dsportal docs portal-yaml` from portal/core/settings.py: edit the descriptions there, then, in a
     checkout, python -m portal.cli docs portal-yaml > docs/reference/portal-yaml.md (tests/test_docs.py) -->

{summary}

The hub and every admin command read the file named by `--config`, else by `$DSPORTAL_CONFIG`, else
`/etc/dsportal/portal.yaml`; only the demo (`make demo`: `python -m democluster`, from the
checkout) falls back to the demo's own file (the checkout's `config/portal.yaml`), and the other commands refuse the demo's
settings, naming each key that names the demo's state folder, unless `DSPORTAL_DEMO=1` says this machine is the
demo ([the CLI](cli.md)). The hub refuses to start on an invalid file and `dsportal check` fails on it, naming
each bad key and its line (`line 70: profiles.0.cpus_per_gpu: Input should be greater than 0`); an unknown key
is an error too, so a typo never falls back to a default.
Durations written `HH:MM:SS` also take `D-HH:MM:SS`; memory sizes are `48G`, `4096M` or megabytes.

Sections: {sections}
"""


def render() -> str:
    """The whole reference, as Markdown."""
    found = list(sections())
    links = " · ".join(f"[`{name}`](#{_anchor(name)})" for name, _ in found[1:])
    renamed = "\n".join(f"| `{old[0]}.{old[1]}` | `{new[0]}.{new[1]}` |" for old, new in RENAMED.items())
    return "\n".join([_INTRO.format(summary=_sentence(Settings.__doc__), sections=links),
                      *(_table(name, model) for name, model in found),
                      "## Renamed settings\n\nA file that still uses an old name is read as if it used the new "
                      "one; the hub logs, and `dsportal check` warns, once per name.\n\n"
                      f"| old name | new name |\n|---|---|\n{renamed}\n"])


def sections(model: type[BaseModel] = Settings, name: str = ""):
    """(dotted name, model) of the top level and of every nested section, depth first."""
    yield name, model
    for key, field in fields(model):
        nested, is_list = _nested(field.annotation)
        if nested:
            yield from sections(nested, f"{name}.{key}".lstrip(".") + ("[]" if is_list else ""))


def fields(model: type[BaseModel]):
    """(key, field) of a section, as portal.yaml spells them."""
    return [(key, field) for key, field in model.model_fields.items() if not field.exclude]


def description(field) -> str:
    """A key's description; a section's is its model's docstring."""
    nested, _ = _nested(field.annotation)
    return field.description or (nested.__doc__ if nested else "") or ""


def _nested(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The settings model a key holds (or may: ``Model | None``), and whether it holds a list of them."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(models) == 1:
            return _nested(models[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    return None, False


def _table(name: str, model: type[BaseModel]) -> str:
    lines = [f"## `{name}`" if name else "## Top level", ""]
    if name and model.__doc__:
        lines += [_sentence(model.__doc__), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for key, field in fields(model):
        path = f"{name}.{key}".lstrip(".")
        lines.append(f"| `{key}` | {_type(field, path)} | {_default(field)} | {_cell(description(field))} |")
    return "\n".join(lines) + "\n"


def _type(field, path: str) -> str:
    nested, is_list = _nested(field.annotation)
    if nested:
        target = path + ("[]" if is_list else "")
        link = f"[`{target}`](#{_anchor(target)})"
        text = f"list of {link} entries" if is_list else f"section {link}"
    else:
        text = _kind(field.annotation)
    limits = []
    for item in field.metadata:
        for attribute, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if isinstance(item, getattr(annotated_types, attribute.capitalize())):
                limits.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            limits.append(f"at least {item.min_length}")
        if isinstance(item, annotated_types.MaxLen):
            limits.append(f"at most {item.max_length} characters")
        if getattr(item, "pattern", None):
            limits.append(f"matching `{_escape(item.pattern)}`")
    return ", ".join([text, *limits])


def _kind(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_kind(arg) for arg in args if arg is not type(None))
    if origin is typing.Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {_kind(args[0])}"
    if origin is dict:
        return f"mapping of {_kind(args[0])} to {_kind(args[1])}"
    if origin is tuple:
        return "[" + ", ".join(_kind(arg) for arg in args) + "]"
    return {str: "text", int: "integer", float: "number", bool: "true/false", Path: "path"}.get(annotation, str(annotation))


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "absent" if _nested(field.annotation)[0] else "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple, dict)):
        return f"`{_escape(json.dumps(value))}`"
    return f"`{_escape(str(value))}`" if str(value) else '`""`'


def _sentence(text: str | None) -> str:
    return " ".join((text or "").split())


def _cell(text: str | None) -> str:
    return _escape(_sentence(text))


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, blanks to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")
