"""The portal's Prometheus metrics, served with JupyterHub's own at /hub/metrics.

Counters are counted where things happen: logins and refused port reports here, sessions starting,
ending and reclaimed in spawner/metrics.py; the hub's Slurm client tells :func:`count_slurm_command`
of each command it runs (portal/slurm/slurmclient.py).
The session and capacity gauges are read at scrape time from
the hub's shared squeue/sinfo snapshots: a scrape never runs a Slurm command of its own.
"""

from __future__ import annotations

import re
import time

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from portal.slurm.slurmparse import partition_resources
from spawner.metrics import IDLE_AFTER_S, last_uses

LOGINS = Counter("dsportal_logins", "Login attempts by outcome (ok, refused, ldap_unavailable, provider_unavailable: "
                 "the OpenID provider, throttled: too many failures, LDAP not asked).", ["outcome"])
PORT_REPORTS_REFUSED = Counter(
    "dsportal_port_reports_refused", "Port reports refused (409): a second report, or one not from the job being started.")

SLURM_COMMANDS = Counter(
    "dsportal_slurm_commands", "Slurm client commands the hub ran, by command and outcome "
    "(ok, error: Slurm refused, unavailable: slurmctld did not answer).", ["command", "outcome"])
SLURM_SECONDS = Histogram(
    "dsportal_slurm_command_seconds", "How long the hub's Slurm client commands took.", ["command"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

DATABASE_UNAVAILABLE = Counter(
    "dsportal_database_unavailable", "Requests answered 503 because the hub's database did not answer the look-up "
    "of their user (portal/hub/databasedown.py).")
REQUESTS_SHED = Counter(
    "dsportal_requests_shed", "Reads that could wait (page views, polling) answered 429 while the hub's event loop "
    "lagged (portal/hub/loadshed.py).")

GC_SECONDS = Counter("dsportal_gc_seconds", "Seconds the hub spent in Python's garbage collector, by generation "
                     "(2: full collections, which stop its event loop longest; portal/hub/gcwatch.py).", ["generation"])
GC_COLLECTIONS = Counter("dsportal_gc_collections", "Collections of Python's garbage collector in the hub, by "
                         "generation.", ["generation"])

SESSION_JOB = re.compile(r"^dsportal-")
class SlurmCollector:
    """Session jobs and GPUs by partition and state, and each partition's GPUs, at scrape time."""

    def __init__(self, slurm):
        self.slurm = slurm

    def collect(self):
        jobs = GaugeMetricFamily("dsportal_session_jobs", "Session jobs Slurm lists, by partition and state "
                                 "(from the hub's last squeue snapshot).", labels=["partition", "state"])
        gpus = GaugeMetricFamily("dsportal_session_gpus", "GPUs of session jobs, by partition and state.",
                                 labels=["partition", "state"])
        counts: dict[tuple[str, str], list[int]] = {}
        by_profile: dict[tuple[str, str], int] = {}
        for job in self.slurm.last_jobs.values():
            if not SESSION_JOB.match(job.name) or job.finished:
                continue
            state = "running" if job.running else "pending"
            entry = counts.setdefault((job.partition, state), [0, 0])
            entry[0] += 1
            entry[1] += job.gpus
            key = (job.profile or "(unknown)", state)
            by_profile[key] = by_profile.get(key, 0) + 1
        for (partition, state), (n, g) in sorted(counts.items()):
            jobs.add_metric([partition, state], n)
            gpus.add_metric([partition, state], g)
        yield jobs
        yield gpus
        profiles = GaugeMetricFamily("dsportal_sessions", "Session jobs by portal profile and state (from the "
                                     "hub's last squeue snapshot).", labels=["profile", "state"])
        for (profile, state), n in sorted(by_profile.items()):
            profiles.add_metric([profile, state], n)
        yield profiles
        idle = GaugeMetricFamily("dsportal_gpus_held_idle", f"GPUs of running sessions unused for at least "
                                 f"{IDLE_AFTER_S} s (no browser, kernel or GPU activity), by partition.",
                                 labels=["partition"])
        held: dict[str, int] = {}
        now = time.monotonic()
        for partition, n, last_use in last_uses():
            if n and now - last_use >= IDLE_AFTER_S:
                held[partition] = held.get(partition, 0) + n
        for partition, n in sorted(held.items()):
            idle.add_metric([partition], n)
        yield idle
        capacity = GaugeMetricFamily("dsportal_partition_gpus", "GPUs of each partition's usable nodes: total and "
                                     "free (from the hub's last sinfo snapshot).", labels=["partition", "kind"])
        for partition, resources in sorted(partition_resources(self.slurm.last_nodes).items()):
            capacity.add_metric([partition, "total"], resources.gpus)
            capacity.add_metric([partition, "free"], resources.free_gpus)
        yield capacity


_registered: set[int] = set()


def count_slurm_command(command: str, outcome: str | None, seconds: float) -> None:
    """A command the hub's Slurm client ran; an outcome of None (it ended otherwise: cancelled) is timed only."""
    SLURM_SECONDS.labels(command).observe(seconds)
    if outcome:
        SLURM_COMMANDS.labels(command, outcome).inc()


def register_slurm(slurm) -> None:
    """Once per Slurm client (the hub has one): its snapshots read at scrape time, its commands counted."""
    slurm.on_command = count_slurm_command
    if id(slurm) not in _registered:
        REGISTRY.register(SlurmCollector(slurm))
        _registered.add(id(slurm))
