"""Rendering of templates/ with escaping: the only way scripts are made."""

from __future__ import annotations

import shlex
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from portal.core import sessionvars
from portal.core.settings import SLURM_TOKEN

_CHECKOUT = Path(__file__).resolve().parents[2] / "templates"


def sbatch_value(value) -> str:
    """A value for an #SBATCH line: refuse anything sbatch or a shell could read as syntax."""
    text = str(value)
    option = text.split("=", 1)
    candidate = option[1] if text.startswith("--") and len(option) == 2 else text
    if text.startswith("--") and len(option) == 1:
        candidate = text[2:]
    if not SLURM_TOKEN.match(candidate):
        raise ValueError(f"refusing {text!r} on an #SBATCH line: only letters, digits and _.:@+=,/- allowed")
    return text


def folder() -> Path:
    """templates/ of the checkout, else of the installed package."""
    return _CHECKOUT if _CHECKOUT.is_dir() else Path(str(resources.files("dsportal_templates")))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        # HTML templates are escaped; shell scripts use the explicit `shell`/`sbatch` filters.
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default=False),
    )
    env.filters["shell"] = lambda value: shlex.quote(str(value))
    env.filters["sbatch"] = sbatch_value
    env.globals["vars"] = sessionvars  # the session's variables by name: {{ vars.SESSION_DIR }}
    return env


def render(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
