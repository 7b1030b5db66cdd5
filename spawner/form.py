"""What a session asks for, checked against the admin's profile before anything reaches Slurm.

Shared by the spawn form, the hub REST API (``user_options``) and, later, the job launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from portal.settings import Profile, format_walltime, parse_memory_mb, parse_walltime


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
    if isinstance(value, bool):
        raise RequestError(f"{name} must be a whole number, not {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.isdigit():
        raise RequestError(f"{name} must be a whole number, not {value!r}")
    return int(text)


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
