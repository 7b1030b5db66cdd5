"""Starts beyond ``hub.concurrent_spawn_limit``: refused in words a person understands.

JupyterHub counts the sessions being started (asked for and not yet ready: for the portal that
includes the time a session waits in Slurm's queue) and refuses a start beyond its
``concurrent_spawn_limit`` with HTTP 429, a Retry-After header and "Too many users trying to log in
right now". Nothing is submitted for a refused start, so nothing is lost: the user (or her script)
tries again. The message here says why and when, on the spawn form and in the REST API's answer.
"""

from __future__ import annotations

from ..settings import human_duration
from .upstream import explain_throttled_spawns


def message(limit: int, retry_seconds: int) -> str:
    """What a user whose start was refused past the limit reads."""
    # JupyterHub rounds its own suggestion the same way: 10 s steps below 90 s, whole minutes above.
    rounded = -(-retry_seconds // 10) * 10 if retry_seconds <= 90 else round(retry_seconds / 60) * 60
    starting = f"{limit} sessions are" if limit != 1 else "1 session is"
    return (f"{starting} starting on the portal right now (sessions waiting in the cluster's queue count too), "
            f"the most it starts at once. Yours was not started and nothing was submitted to the cluster: "
            f"please try again in about {human_duration(rounded)}.")


def _explain(handler, retry_seconds: int) -> str:
    return message(handler.concurrent_spawn_limit, retry_seconds)


def explain_refused_starts() -> None:
    """Installed by portal/hub/config.py; idempotent."""
    explain_throttled_spawns(_explain)
