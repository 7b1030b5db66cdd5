"""What a session asks for, checked against the admin's profile before anything reaches Slurm.

Shared by the spawn form, the hub REST API (``user_options``) and the session's job launcher
(portal/session/jobs.py); who may use a profile goes by the user's Unix groups.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from portal.settings import Profile, format_walltime, described, parse_memory_mb, parse_walltime, shown, whole_number


class RequestError(ValueError):
    """A request the profile does not allow; the message is meant for the user."""


@dataclass(frozen=True)
class SessionSlice:
    profile: Profile
    gpus: int
    cpus: int
    mem_mb: int
    walltime: str

    def describe(self) -> str:
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}, " if self.gpus else ""
        return f"{gpus}{self.cpus} CPUs, {self.mem_mb // 1024} GB, {self.walltime} on {self.profile.partition}"


def _as_int(name: str, value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = whole_number(value)
    if number is None or number < 0:  # digits 0-9 only: whole_number refuses '²' and '٢'
        raise RequestError(f"{name} must be a whole number (digits 0-9), not {described(value)}")
    return number


def session_slice(profile: Profile, gpus=None, walltime=None) -> SessionSlice:
    """The exact Slurm slice for ``gpus`` GPUs on ``profile``: CPUs and memory follow the GPUs."""
    gpus = profile.default_gpus if gpus in (None, "") else _as_int("GPU count", gpus)
    if gpus not in profile.gpu_choices:
        choices = ", ".join(map(str, profile.gpu_choices))
        raise RequestError(f"{gpus} GPUs is not offered on {profile.display_name}: choose one of {choices}")
    walltime = profile.default_walltime if walltime in (None, "") else str(walltime).strip()
    try:
        seconds = parse_walltime(walltime)
    except ValueError as error:
        raise RequestError(f"walltime {error}") from None
    if seconds <= 0:
        raise RequestError("walltime must be longer than zero")
    if seconds > parse_walltime(profile.max_walltime):
        raise RequestError(f"walltime {walltime} is longer than the {profile.max_walltime} allowed on {profile.display_name}")
    if gpus:
        cpus, mem_mb = gpus * profile.cpus_per_gpu, gpus * parse_memory_mb(profile.mem_per_gpu)
    else:
        cpus, mem_mb = profile.cpus_without_gpu, parse_memory_mb(profile.mem_without_gpu)
    return SessionSlice(profile=profile, gpus=gpus, cpus=cpus, mem_mb=mem_mb, walltime=format_walltime(seconds))


OPTIONS = ("profile", "gpus", "walltime")


def unix_groups(username: str) -> set[str]:
    """The user's groups as the cluster sees them (LDAP via NSS on a real cluster)."""
    try:
        entry = pwd.getpwnam(username)
    except KeyError:
        return set()
    names = set()
    for gid in os.getgrouplist(username, entry.pw_gid):
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return names


def may_use(profile: Profile, user_groups: set[str]) -> bool:
    return not profile.groups or bool(user_groups & set(profile.groups))


def parse_options(options: dict, profiles: list[Profile], user_groups: set[str], default_profile: str) -> SessionSlice:
    """Validate a request (spawn form or hub API ``user_options``) into the slice to submit."""
    if not isinstance(options, dict):
        raise RequestError("options must be an object like {'profile': 'gpu', 'gpus': 1}")
    unknown = sorted(str(k) for k in options if k not in OPTIONS)
    if unknown:
        raise RequestError(f"unknown option(s) {', '.join(map(shown, unknown))}: allowed are {', '.join(OPTIONS)}")
    for key in ("profile", "walltime"):
        if key in options and not isinstance(options[key], str):
            raise RequestError(f"{key} must be text, not {described(options[key])}")
    if "gpus" in options and options["gpus"] is None:
        raise RequestError("gpus must be a whole number, not null (leave it out for the profile's default)")
    name = options.get("profile") or default_profile
    by_name = {p.name: p for p in profiles}
    if name not in by_name:
        offered = ", ".join(p.name for p in profiles if may_use(p, user_groups))
        raise RequestError(f"unknown partition profile {shown(name)}: choose one of {offered}")
    profile = by_name[name]
    if not may_use(profile, user_groups):
        raise RequestError(f"{profile.display_name} is reserved for members of {', '.join(profile.groups)}")
    gpus, walltime = options.get("gpus"), options.get("walltime")
    try:
        return session_slice(profile, gpus, walltime)
    except RequestError as error:
        raise RequestError(str(error).replace(repr(gpus), shown(gpus))) from None


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """The chosen profile's own fields (each profile has its own 'gpus.NAME' and 'walltime.NAME')."""
    profile = (formdata.get("profile") or [""])[0]
    options = {"profile": profile}
    for key in ("gpus", "walltime"):
        values = formdata.get(f"{key}.{profile}")
        if values:
            options[key] = values[0].strip()
    return options
