"""The spawners' Prometheus metrics (served with the hub's, portal/hub/metrics.py): session starts
that failed, time in Slurm's queue, sessions that ended outside the portal or were reclaimed idle,
and how long each running session has been unused."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram

SESSIONS_ENDED = Counter(
    "dsportal_sessions_ended_outside", "Session jobs that ended without a stop through the portal, by how: "
    "Slurm's state (CANCELLED, TIMEOUT, NODE_FAIL, FAILED...), or IDLE when the idle limit stopped them.",
    ["partition", "how"])
IDLE_GPUS_RECLAIMED = Counter(
    "dsportal_idle_gpus_reclaimed", "GPUs given back to the queue by stopping unused sessions.", ["partition"])
SPAWN_FAILURES = Counter(
    "dsportal_spawn_failures", "Session starts that failed, by profile and reason (invalid-request: refused by the "
    "portal; submit-refused: refused by sbatch, e.g. a QoS limit; scheduler-unavailable; job-failed: the job ended "
    "before JupyterLab answered).", ["profile", "reason"])
SPAWN_PENDING = Histogram(
    "dsportal_spawn_pending_seconds", "How long session jobs waited in Slurm's queue before they started, by profile.",
    ["profile"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400))
IDLE_AFTER_S = 900  # a running GPU session unused this long counts as holding its GPUs idle

# Running sessions' partition, GPUs and when each was last used (monotonic clock), kept up to date
# by the spawners' polls and dropped when a session stops.
_last_use: dict[int, tuple[str, int, float]] = {}


def session_idle(key: int, partition: str, gpus: int, idle_seconds: float | None) -> None:
    """Called on each poll of a running session (None: starting, stopping or gone)."""
    if idle_seconds is None:
        _last_use.pop(key, None)
    else:
        _last_use[key] = (partition, gpus, time.monotonic() - idle_seconds)


def last_uses() -> list[tuple[str, int, float]]:
    """(partition, GPUs, last use on the monotonic clock) of each running session."""
    return list(_last_use.values())
