"""What a user may launch from their session: written by the hub (the spawner) into the session
job's environment (``DSPORTAL_LAUNCH_POLICY``), read by the session's job launcher.

The profiles, images and data mounts of portal.yaml that this user may use: the same rules as
the spawn form, shown early and clearly in the session.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict

from .settings import DataMount, Image, Profile, shown

POLICY_ENV = "DSPORTAL_LAUNCH_POLICY"


class JobRequestError(ValueError):
    """A job request the policy does not allow; the message is meant for the user."""


class LaunchPolicy(BaseModel):
    """What this user may launch: written by the hub into the session's environment."""

    model_config = ConfigDict(extra="forbid")

    profiles: list[Profile]
    default_profile: str
    images: list[Image] = []
    data_mounts: list[DataMount] = []
    environment: str = "/opt/dsportal/env"
    node_gpus: dict[str, int] = {}  # partition -> most GPUs any one of its nodes has (from sinfo)
    node_count: dict[str, int] = {}  # partition -> usable nodes

    def to_env(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    @classmethod
    def from_env(cls, environ=None) -> "LaunchPolicy":
        raw = (environ if environ is not None else os.environ).get(POLICY_ENV)
        if not raw:
            raise JobRequestError("this session has no job launch policy (it was not started by dsportal's hub)")
        return cls.model_validate_json(raw)

    def profile(self, name: str | None) -> Profile:
        wanted = name or self.default_profile
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        offered = ", ".join(p.name for p in self.profiles)
        raise JobRequestError(f"unknown or not permitted partition profile {shown(wanted)}: choose one of {offered}")

    def images_for(self, profile: Profile) -> list[Image]:
        return [i for i in self.images if not i.profiles or profile.name in i.profiles]
