"""What the hub tells a session job: one typed spec, in one environment variable (sessionvars.SESSION).

The hub makes it as it submits the job (spawner/gpuspawner.py's get_env), from the judged request and the
portal's settings; the session reads it once, validated (:func:`current`), and its parts read what is theirs:
the activity reports, the idle limit, the walltime's warning, the port report's wait, dsportal's service,
the tools on offer, the job launcher's policy, the sharing groups and the template sources.

A spec that does not validate, or a session job without one, stops the session's start with the reason
(portal/session/singleuser.py): nothing of the session runs on settings it cannot trust. A server that is no
session job (``jupyter lab`` by hand, the template check's kernels) gets the defaults below.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from portal.core import defaults, sessionvars
from portal.core.rules import LaunchPolicy, RequestError
from portal.core.settings import TOOLS
from portal.core.templatesources import Spec

GROUP_NAME = r"^[a-z_][a-z0-9_-]{0,31}$"


class SessionToolsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    offered: list[Literal[TOOLS]] = list(TOOLS)
    code_server: str = defaults.CODE_SERVER
    r_repository: str = defaults.R_REPOSITORY


class TemplateSourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    display_name: str = ""
    description: str = ""


class TemplatesSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    folder: str = "templates"
    copies: str = "notebooks"
    sources: list[TemplateSourceSpec] = []

    def spec(self) -> Spec:
        return Spec.from_dict(self.model_dump())


class SessionSpec(BaseModel):
    """Everything dsportal's hub tells one session job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    activity_interval: int = Field(defaults.ACTIVITY_INTERVAL, ge=1)  # seconds between activity reports
    gpu_busy_percent: int = Field(defaults.GPU_BUSY_PERCENT, ge=0, le=100)  # a GPU this busy counts as in use
    idle_limit: int = Field(0, ge=0)  # seconds: the profile's idle limit for this slice (0: none)
    save_ahead: int = Field(defaults.SAVE_AHEAD, ge=0)  # seconds: Slurm signals the walltime's end this early
    report_wait: float = Field(300.0, ge=1)  # seconds: the hub's limit for this start (hub.start_timeout, 300 where
    # the hub did not say); the port report waits as long
    service_url: str = ""  # dsportal's JupyterHub service (more walltime: portal.hub.extend); '' none
    tools: SessionToolsSpec = SessionToolsSpec()
    launch_policy: LaunchPolicy | None = None  # what the job launcher may use (None: no launching)
    sharing_groups: list[Annotated[str, StringConstraints(pattern=GROUP_NAME)]] = []  # her sharing groups,
    # for a session started shareable ([]: not shareable)
    templates: TemplatesSpec | None = None  # the template sources she sees (None: none)

    def to_env(self) -> str:
        return self.model_dump_json()


class SpecError(ValueError):
    """The session's spec (sessionvars.SESSION) is not one the hub wrote."""


def parse(raw: str) -> SessionSpec:
    try:
        spec = SessionSpec.model_validate_json(raw)
    except ValidationError as error:
        raise SpecError(f"{sessionvars.SESSION} is not a session spec of dsportal's hub: "
                        f"{error.error_count()} error(s), first: {error.errors()[0]['loc']}: "
                        f"{error.errors()[0]['msg']}") from None
    return spec


def current(environ=None) -> SessionSpec:
    """This session's spec, validated once (SpecError if the variable holds one that does not validate)."""
    environ = os.environ if environ is None else environ
    return _read(environ.get(sessionvars.SESSION, ""), _legacy(environ) if sessionvars.SESSION not in environ else "")


@lru_cache(maxsize=8)
def _read(raw: str, legacy: str) -> SessionSpec:
    if raw:
        return parse(raw)
    return parse(legacy) if legacy else SessionSpec()


def _legacy(environ) -> str:
    """The spec of a session started by dsportal 0.3 (one variable a setting), for the session code that a running
    0.3 session loads after an upgrade in place (a kernel started since, reading the launch policy). '' for none.
    To go with 0.5."""
    names = {"activity_interval": "DSPORTAL_ACTIVITY_INTERVAL", "gpu_busy_percent": "DSPORTAL_GPU_BUSY_PERCENT",
             "idle_limit": "DSPORTAL_IDLE_LIMIT", "save_ahead": "DSPORTAL_SAVE_AHEAD",
             "report_wait": "DSPORTAL_REPORT_WAIT", "service_url": "DSPORTAL_SERVICE_URL"}
    found: dict = {key: environ[name] for key, name in names.items() if environ.get(name)}
    try:
        for key, name in (("tools", "DSPORTAL_TOOLS"), ("launch_policy", "DSPORTAL_LAUNCH_POLICY"),
                          ("templates", "DSPORTAL_TEMPLATES")):
            if environ.get(name):
                found[key] = json.loads(environ[name])
        if environ.get("DSPORTAL_SHARING"):
            found["sharing_groups"] = json.loads(environ["DSPORTAL_SHARING"]).get("groups", [])
    except (ValueError, AttributeError) as error:
        raise SpecError(f"a setting of this session (dsportal 0.3's variables) is not JSON: {error}") from None
    return json.dumps(found) if found else ""


def given(environ=None) -> bool:
    """Whether the hub gave this process a spec (its own variable, or a 0.3 session's variables)."""
    environ = os.environ if environ is None else environ
    return sessionvars.SESSION in environ or bool(_legacy(environ))


def launch_policy(environ=None) -> LaunchPolicy:
    """What the job launcher may use in this session; RequestError, in words, where it may launch nothing."""
    policy = current(environ).launch_policy
    if policy is None:
        raise RequestError("this session has no job launch policy (it was not started by dsportal's hub)")
    return policy


def templates(environ=None) -> Spec | None:
    found = current(environ).templates
    return found.spec() if found is not None else None
