"""`dsportal usage`: who used which GPUs, from Slurm accounting (slurmdbd, `sacct`).

Sessions (jobs named dsportal-<user>) and multi-node jobs are counted apart. GPU-hours are the
job's allocated GPUs (AllocTRES gres/gpu, all nodes) times its elapsed time. One sacct call.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta

FIELDS = ("JobID", "User", "JobName", "Partition", "State", "ElapsedRaw", "AllocTRES")
_GPUS = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


class UsageUnavailable(RuntimeError):
    """sacct failed: no accounting on this cluster, or slurmdbd does not answer."""


@dataclass
class Row:
    user: str
    partition: str
    sessions: int = 0
    session_gpu_s: float = 0.0
    jobs: int = 0
    job_gpu_s: float = 0.0
    states: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_hours(self) -> float:
        return (self.session_gpu_s + self.job_gpu_s) / 3600


def gpus_of(tres: str) -> int:
    # Typed GPUs (gres/gpu:h100=2) appear beside the untyped total (gres/gpu=2): take the total.
    untyped = re.search(r"(?:^|,)gres/gpu=(\d+)", tres or "")
    return int(untyped.group(1)) if untyped else sum(int(n) for n in _GPUS.findall(tres or ""))


def parse(text: str) -> dict[tuple[str, str], Row]:
    rows: dict[tuple[str, str], Row] = {}
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != len(FIELDS):
            continue
        record = dict(zip(FIELDS, values))
        if not record["JobID"].isdigit():
            continue
        row = rows.setdefault((record["User"], record["Partition"]), Row(record["User"], record["Partition"]))
        gpu_s = gpus_of(record["AllocTRES"]) * int(record["ElapsedRaw"] or 0)
        if record["JobName"].startswith("dsportal-"):
            row.sessions += 1
            row.session_gpu_s += gpu_s
        else:
            row.jobs += 1
            row.job_gpu_s += gpu_s
        state = (record["State"].split() or ["?"])[0]
        row.states[state] = row.states.get(state, 0) + 1
    return rows


def collect(days: int, user: str | None = None, env: dict | None = None) -> dict[tuple[str, str], Row]:
    since = (datetime.now() - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S")
    argv = ["sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-o", ",".join(FIELDS)]
    argv += ["-u", user] if user else ["-a"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageUnavailable(f"sacct did not run: {error}") from None
    if result.returncode != 0:
        raise UsageUnavailable((result.stderr or result.stdout).strip() or f"sacct exit status {result.returncode}")
    return parse(result.stdout)


def report(rows: dict[tuple[str, str], Row], days: int) -> str:
    lines = [f"{'user':<12} {'partition':<10} {'sessions':>8} {'session GPU-h':>13} {'jobs':>5} {'job GPU-h':>9}  states"]
    for (user, partition), row in sorted(rows.items(), key=lambda item: (-item[1].gpu_hours, item[0])):
        states = ", ".join(f"{state} {n}" for state, n in sorted(row.states.items()))
        lines.append(f"{user:<12} {partition:<10} {row.sessions:>8} {row.session_gpu_s / 3600:>13.3f} "
                     f"{row.jobs:>5} {row.job_gpu_s / 3600:>9.3f}  {states}")
    total = sum(row.gpu_hours for row in rows.values())
    users = len({user for user, _ in rows})
    lines.append(f"usage: {total:.3f} GPU-hours by {users} user(s) in the last {days} day(s) "
                 f"({sum(r.sessions for r in rows.values())} sessions, {sum(r.jobs for r in rows.values())} jobs)")
    return "\n".join(lines)
